"""The Hugging Face folder: config.json and safetensors shards (read tensor by tensor)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from wide_export.errors import WideError
from wide_export.model.arch import arch_for


def read_hf_config(model_dir: Path) -> Any:
    """The transformers config of a local folder, refusing unsupported models first."""
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise WideError(f"--model {model_dir} is a file, not a folder",
                        f"pass the Hugging Face model folder that holds it: --model {model_dir.parent}")
    if not model_dir.is_dir():
        raise WideError(f"model folder not found: {model_dir}", "pass --model DIR, a Hugging Face model folder")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise WideError(f"{model_dir} has no config.json",
                        "pass a Hugging Face causal-LM folder (config.json + *.safetensors)")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise WideError(f"cannot parse {cfg_path}: {err}", "the model folder looks damaged") from None
    arch_for(raw.get("model_type"))  # refuse unknown architectures before transformers sees them
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)


def safetensors_files(model_dir: Path) -> list[Path]:
    """All weight shards of the folder (index-listed or globbed)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WideError(f"{model_dir}: shards listed in the index are missing: {', '.join(missing[:3])}",
                            "download the complete model folder")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WideError(f"{model_dir} has no *.safetensors weights",
                        "save the model with save_pretrained(safe_serialization=True); .bin pickles are not read")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor, one at a time (memory-mapped)."""
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
