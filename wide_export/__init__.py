"""wide-export: deploy WIDE (token-level dynamic width) LLMs.

Heavy dependencies (torch, onnx, onnxruntime, tensorrt, tritonclient) are
imported lazily by the modules that need them, so importing this package and
running ``wide-export --help`` stays instant.
"""

__version__ = "0.1.0"

from wide_export.base.errors import WideError

__all__ = ["WideError", "__version__"]
