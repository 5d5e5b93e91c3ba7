"""Which of the folders wide-export writes or reads a path is, and which command or flag takes it.

A command given the wrong kind of folder says what it got and where that goes,
not only what it misses: `triton --onnx` on a tensor-parallel export points to
`run-tp`, `verify --onnx` on an engine folder to `--engine`. Recognised by the
marker file each writer leaves (base/names.py, tp/plan.py); nothing
heavy is read (one small JSON for a vLLM folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from wide_export.base.names import ENGINE_MANIFEST, ONNX_FILE, VLLM_FORMAT, VLLM_SECTION, WIDE_CONFIG


def _is_vllm(folder: Path) -> bool:
    from wide_export.base.errors import WideError
    from wide_export.base.paths import read_json

    try:
        raw = read_json(folder / "config.json")
    except (WideError, OSError):
        return False
    section = raw.get(VLLM_SECTION) if isinstance(raw, dict) else None
    return isinstance(section, dict) and section.get("format") == VLLM_FORMAT


def _is_repository(folder: Path) -> bool:
    try:
        return any((child / "config.pbtxt").is_file() for child in folder.iterdir() if child.is_dir())
    except OSError:
        return False


# kind -> (test, what it is, where it goes: generic; per wanted kind below). First match wins.
KINDS: dict[str, tuple[Callable[[Path], bool], str]] = {
    "sharded": (lambda f: (f / "tp_manifest.json").is_file(), "a tensor-parallel ONNX export (wide-export onnx --tp)"),
    "onnx": (lambda f: (f / ONNX_FILE).is_file() and (f / WIDE_CONFIG).is_file(),
             "an ONNX export (wide-export onnx)"),
    "engines": (lambda f: (f / ENGINE_MANIFEST).is_file(), "an engine folder (wide-export trt)"),
    "vllm": (_is_vllm, "a vLLM folder (wide-export vllm)"),
    "repository": (_is_repository, "a Triton model repository (wide-export triton)"),
    "model": (lambda f: (f / "config.json").is_file(), "a Hugging Face model folder"),
}
USE = {  # where each kind goes, whatever was asked for
    "sharded": "run its ranks with `wide-export run-tp --onnx DIR` (and check it with `wide-export verify "
               "--onnx DIR`); Triton and TensorRT take an export without --tp",
    "onnx": "pass it as --onnx DIR (wide-export trt, triton, verify)",
    "engines": "pass it as --engines DIR (triton) or --engine DIR (verify)",
    "vllm": "serve it with `vllm serve DIR` (`wide-vllm serve DIR` with the CPU wheel, docs/vllm.md); --model "
            "takes the Hugging Face folder it was written from",
    "repository": "serve it with `wide-export serve --repository DIR`",
    "model": "export it first: `wide-export onnx --model DIR --output OUT`",
}


def kind_of(folder: Path) -> Optional[str]:
    """The kind of `folder` (a key of KINDS), or None when it is none of them (or not a folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    return next((kind for kind, (test, _) in KINDS.items() if test(folder)), None)


def elsewhere(folder: Path, wanted: str, uses: Optional[dict[str, str]] = None) -> Optional[str]:
    """A hint for a folder given where `wanted` was expected: what it is and which command or flag takes it;
    None when it is of the wanted kind or unrecognised (the caller's own hint stands). `uses`: this command's
    own way per kind, where it has one ({"engines": "pass it as --engine DIR"} for verify)."""
    kind = kind_of(folder)
    if kind is None or kind == wanted:
        return None
    return f"{Path(folder)} is {KINDS[kind][1]}: {(uses or {}).get(kind, USE[kind])}"
