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
import sys
import tempfile
from pathlib import Path
from typing import Any

from wide_export.base.childproc import start, stop_group
from wide_export.base.errors import WideError
from wide_export.base.signals import interrupt_on_signals


def run_in_child(function: str, kwargs: dict[str, Any], env: dict[str, str]) -> Any:
    """Call `module:name`(**kwargs) in a child Python with `env`; return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="wide-trt-child-") as tmp:
        result = Path(tmp) / "result.json"
        request = json.dumps({"function": function, "kwargs": kwargs, "result": str(result)})
        with interrupt_on_signals():
            # its own process group, SIGTERM if we die: a Ctrl-C reaches us, and we stop it (it cleans up on
            # SIGTERM and exits 130)
            proc = start([sys.executable, "-m", "wide_export.trt._child", request], die_with_parent=True, env=env)
            try:
                proc.wait()
            except BaseException:
                stop_group(proc)
                raise
        if result.is_file():
            answer = json.loads(result.read_text())
            if "error" in answer:
                raise WideError(answer["error"], answer.get("hint"))
            return answer["ok"]
        if proc.returncode == 130:  # the child was interrupted (it cleaned up)
            raise KeyboardInterrupt
        raise RuntimeError(f"{function} died in its child process (exit code {proc.returncode}); "
                           "see the TensorRT messages above")


def _main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    module, name = request["function"].split(":")
    fn = getattr(importlib.import_module(module), name)
    result = Path(request["result"])
    try:
        with interrupt_on_signals():  # Ctrl-C or the parent's SIGTERM: clean up, exit 130
            value = fn(**request["kwargs"])
    except WideError as err:
        result.write_text(json.dumps({"error": err.message, "hint": err.hint}))
        return 2
    except KeyboardInterrupt:  # Ctrl-C or the parent's SIGTERM: temp outputs are already removed
        return 130
    result.write_text(json.dumps({"ok": value}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
