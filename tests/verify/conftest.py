"""Fixtures of the verify tests: a tiny checkpoint and its float32 export, made once per session.

With $WIDE_TEST_EXPORT_CACHE set (scripts/mutation-test.py sets it) they are kept in that folder and
reused by later sessions: mutmut runs the tests once per mutant, and the export costs ~20 s."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import make_checkpoint

if os.environ.get("WIDE_TEST_EXPORT_CACHE"):
    # Under scripts/mutation-test.py: mutmut's forkserver forks every mutant's test run from the process that
    # collected the tests, so what is imported here is not imported again per mutant (load_wide_model's
    # first call alone imports ~20 s of torch._dynamo and transformers on a loaded 2-core machine).
    import huggingface_hub.serialization  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import polygraphy.comparator  # noqa: F401
    import torch._dynamo  # noqa: F401
    from transformers import AutoConfig

    AutoConfig.for_model("llama")

SPEC = dict(num_layers=2, hidden_size=32, intermediate_size=96, num_heads=4, num_kv_heads=2, vocab_size=64)


def cached(name: str, make, tmp_path_factory) -> Path:
    """make(folder) once into $WIDE_TEST_EXPORT_CACHE/name (atomically), or into a fresh temporary folder."""
    cache = os.environ.get("WIDE_TEST_EXPORT_CACHE")
    if not cache:
        root = tmp_path_factory.mktemp(name)
        make(root)
        return root
    root = Path(cache) / name
    if not (root / ".complete").is_file():
        temp = Path(f"{root}.tmp{os.getpid()}")
        shutil.rmtree(temp, ignore_errors=True)
        make(temp)
        (temp / ".complete").write_text("")
        try:
            temp.rename(root)
        except OSError:  # another process made it meanwhile
            shutil.rmtree(temp, ignore_errors=True)
    return root


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    return cached("verify-tiny-ckpt", lambda root: make_checkpoint(root / "ckpt", **SPEC), tmp_path_factory) / "ckpt"


@pytest.fixture(scope="session")
def tiny(tiny_ckpt, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, its float32 export folder)."""
    def export(root: Path) -> None:
        from wide_export.checkpoint import load_wide_model
        from wide_export.export.onnx_export import export_onnx

        export_onnx(load_wide_model(tiny_ckpt, dtype="float32"), root / "onnx")

    return tiny_ckpt, cached("verify-tiny-f32", export, tmp_path_factory) / "onnx"


@pytest.fixture(scope="session")
def tiny_bf16(tiny_ckpt, tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, its bfloat16 export folder): verified by onnx's reference evaluator."""
    def export(root: Path) -> None:
        from wide_export.checkpoint import load_wide_model
        from wide_export.export.onnx_export import export_onnx

        export_onnx(load_wide_model(tiny_ckpt, dtype="bfloat16"), root / "onnx")

    return tiny_ckpt, cached("verify-tiny-bf16", export, tmp_path_factory) / "onnx"
