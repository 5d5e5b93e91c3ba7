"""Which mode OpenAI Triton runs in: its CPU interpreter where this machine has no NVIDIA GPU.

Triton decides between interpreter and compiled mode once, when ``triton.language`` is first imported (and
torch.onnx's exporter imports it), so the choice must be made before that. A process makes it by calling
``interpreter_without_gpu()`` first: the `wide-export` command does at its start (and the tests' conftest).
The kernels' loader (launch.kernels) makes its own choice before it imports them, from
``torch.cuda.is_available()`` (torch is loaded by then). Importing wide_export itself changes no environment
variable.
No torch, no triton here: this must stay importable before both.
"""

from __future__ import annotations

import os

INTERPRET_ENV = "TRITON_INTERPRET"
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")


def interpreter_without_gpu() -> None:
    """Set TRITON_INTERPRET=1 where no NVIDIA device file exists; an explicit TRITON_INTERPRET is kept."""
    if INTERPRET_ENV not in os.environ and not any(os.path.exists(p) for p in _GPU_DEVICES):
        os.environ[INTERPRET_ENV] = "1"
