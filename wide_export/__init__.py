"""wide-export: deploy WIDE (token-level dynamic width) LLMs.

Heavy dependencies (torch, onnx, onnxruntime, tensorrt, tritonclient) are
imported lazily by the modules that need them, so importing this package and
running ``wide-export --help`` stays instant.
"""

__version__ = "0.1.0"

import os as _os

from wide_export.errors import WideError


def _triton_interpreter_without_gpu() -> None:
    """Switch OpenAI Triton's CPU interpreter on when this machine has no NVIDIA GPU.

    Triton decides between interpreter and compiled mode once, when
    ``triton.language`` is first imported, and torch.onnx's exporter imports
    it: the kernels of ``wide_export.kernels`` can run on CPU tensors only if
    the choice is made before that. An explicit TRITON_INTERPRET is respected.
    """
    if "TRITON_INTERPRET" not in _os.environ and not any(
            _os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")):
        _os.environ["TRITON_INTERPRET"] = "1"


_triton_interpreter_without_gpu()

__all__ = ["WideError", "__version__"]
