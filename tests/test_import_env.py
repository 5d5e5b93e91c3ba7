"""Importing wide_export changes no environment variable (a vLLM worker or any other importer keeps its own
TRITON_INTERPRET); the `wide-export` command switches Triton's CPU interpreter on for its own process where
there is no GPU, before anything imports triton (kernels/mode.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = """
import json, os
before = dict(os.environ)
import wide_export, wide_export.ops.dispatch, wide_export.model.modeling, wide_export.checkpoint, wide_export.kernels
import wide_export.cpu, wide_export.serving.openai, wide_export.tritonserver, wide_export.vllm, wide_export.verify
print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))
"""


def test_importing_wide_export_changes_no_environment():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


def test_the_command_switches_the_interpreter_on_without_a_gpu(monkeypatch):
    from wide_export.kernels import mode

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(mode, "_GPU_DEVICES", ("/nonexistent/nvidiactl",))
    mode.interpreter_without_gpu()
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # an explicit choice is kept
    mode.interpreter_without_gpu()
    assert os.environ["TRITON_INTERPRET"] == "0"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(mode, "_GPU_DEVICES", (sys.executable,))  # "a device file exists"
    mode.interpreter_without_gpu()
    assert "TRITON_INTERPRET" not in os.environ
