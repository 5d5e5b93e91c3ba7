"""Triton Inference Server deployment: model repositories and a loopback server.

`generate_repository` writes a model repository (onnxruntime or tensorrt
flavour); `TritonServer` runs a real tritonserver on it. Heavy imports (onnx,
tritonclient) stay inside the functions that need them.
"""

from wide_export.tritonserver.repository import BACKENDS, RepoOptions, generate_repository
from wide_export.tritonserver.server import TritonServer, find_tritonserver

__all__ = ["BACKENDS", "RepoOptions", "TritonServer", "find_tritonserver", "generate_repository"]
