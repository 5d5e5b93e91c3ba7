"""Read an engine folder's `wide_engine.json` (written by trt/build_engines.py) as every JSON file of a user's folder is
read: a one-line error naming where the folder belongs when it has none, the file confined to the folder, size-
and depth-checked (paths.read_json). Its callers validate what they need of it: `verify --engine`
(trt/verify.py) and the Triton repository's tensorrt flavour (tritonserver/engines.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError
from wide_export.base.names import ENGINE_MANIFEST
from wide_export.base.paths import confined, read_json

REBUILD_HINT = "rebuild the engines with `wide-export trt`"


def read_engine_manifest(folder: Path, missing_hint: str) -> Any:
    """The parsed `folder`/wide_engine.json, not yet validated; `missing_hint`: what to do when there is none
    (after the hint that names the command taking the folder, where it is another of our folders)."""
    folder = Path(folder)
    path = folder / ENGINE_MANIFEST
    if not path.is_file():
        from wide_export.base.folders import elsewhere

        raise WideError(f"{path} not found",
                        hint=elsewhere(folder, "engines", {"onnx": "pass it as --onnx DIR"}) or missing_hint)
    confined(path, folder, "engine manifest")
    return read_json(path, hint=REBUILD_HINT)
