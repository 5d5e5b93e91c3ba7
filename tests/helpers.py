"""Shared test helpers: tiny WIDE checkpoints written to disk through the real code paths."""

from __future__ import annotations

from pathlib import Path

from wide_export.model.synthetic import SyntheticSpec, write_checkpoint


def make_checkpoint(tmp: Path, **spec_kwargs) -> Path:
    lora = spec_kwargs.pop("lora", False)
    spec = SyntheticSpec(**spec_kwargs)
    return write_checkpoint(Path(tmp), spec, lora=lora)
