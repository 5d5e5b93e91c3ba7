"""Run a wide_export.trt function in a child process with a prepared environment.

Used for TensorRT-RTX, whose ONNX parser dlopens `libtensorrt_rtx.so` through
LD_LIBRARY_PATH (read by glibc at process start only): see backend.py.
Protocol: argv[1] is a JSON request {"function": "module:name", "kwargs": {...},
"result": path}; the child writes {"ok": value} or {"error": msg, "hint": ...}
to `result`. Bugs keep their traceback on stderr and a non-zero exit code.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from wide_export.errors import WideError


def run_in_child(function: str, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
    """Call `module:name`(**kwargs) in a child Python with `env`; return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="wide-trt-child-") as tmp:
        result = Path(tmp) / "result.json"
        request = json.dumps({"function": function, "kwargs": kwargs, "result": str(result)})
        proc = subprocess.run([sys.executable, "-m", "wide_export.trt._child", request], env=env)
        if result.is_file():
            answer = json.loads(result.read_text())
            if "error" in answer:
                raise WideError(answer["error"], answer.get("hint"))
            return answer["ok"]
        raise RuntimeError(f"{function} died in its child process (exit code {proc.returncode}); "
                           "see the TensorRT messages above")


def _main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    module, name = request["function"].split(":")
    fn = getattr(importlib.import_module(module), name)
    result = Path(request["result"])
    try:
        value = fn(**request["kwargs"])
    except WideError as err:
        result.write_text(json.dumps({"error": err.message, "hint": err.hint}))
        return 2
    result.write_text(json.dumps({"ok": value}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
