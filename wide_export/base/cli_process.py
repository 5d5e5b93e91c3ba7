"""Run the real `wide-export` command in a child process (tests, benchmarks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from wide_export.base.errors import WideError


def export_onnx_cli(folder: Path, timeout: float = 600.0) -> Path:
    """Export the default demo model with `wide-export onnx --output folder --no-verify`.

    A subprocess of the real command, so the model is exactly what users get.
    """
    cmd = [sys.executable, "-c", "from wide_export.cli import main; main()", "onnx", "--output", str(folder),
           "--no-verify"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise WideError(f"`wide-export onnx` failed (code {done.returncode}): {done.stderr.strip()[-2000:]}")
    return folder
