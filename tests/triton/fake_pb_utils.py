"""A stand-in for Triton's `triton_python_backend_utils` (pb_utils) with "GPU" tensors, for
testing the tensorrt flavour's BLS step without a GPU.

It follows the python_backend API the generation model uses (README "Business Logic
Scripting", "Interoperability and GPU Support"; src/pb_stub.cc binds Tensor.as_numpy,
to_dlpack, is_cpu, shape, from_dlpack, __dlpack__, __dlpack_device__):
- a Tensor in GPU memory refuses `as_numpy()` (src/pb_tensor.cc PbTensor::AsNumpy throws
  "Tensor is stored in GPU and cannot be converted to NumPy.");
- `Tensor.from_dlpack(name, obj)` wraps any DLPack object without copying.
The fake's "GPU memory" is host memory it labels as GPU (`is_cpu()` False), so DLPack
consumers (numpy, CPU torch) can read it; what is tested is that the model never asks for
a GPU tensor's host copy and hands presents back unchanged. The "engine" model runs the tiny
contract model in ONNX Runtime and answers in the memory the request prefers.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2


class GpuAsNumpyError(RuntimeError):
    """What python_backend raises for as_numpy() on a GPU tensor."""


class Tensor:
    def __init__(self, name: str, array, gpu: bool = False, origin=None):
        self._name, self._array, self._gpu, self.origin = name, np.asarray(array), gpu, origin

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return not self._gpu

    def shape(self) -> list:
        return list(self._array.shape)

    def as_numpy(self) -> np.ndarray:
        if self._gpu:
            FAKE.gpu_as_numpy += 1
            raise GpuAsNumpyError("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def __dlpack__(self, stream=None, **_ignored):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)  # the fake's "GPU memory" is host memory, readable by CPU DLPack consumers

    def to_dlpack(self):
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, obj) -> "Tensor":
        # Device memory stays device memory: a GPU Tensor, or a tensor the model built from one.
        gpu = not isinstance(obj, np.ndarray) and not (isinstance(obj, Tensor) and obj.is_cpu())
        FAKE.from_dlpack += 1
        import torch  # numpy 1.x marks np.from_dlpack arrays read-only, which DLPack cannot export again

        return Tensor(name, torch.from_dlpack(obj).numpy(), gpu=gpu, origin=obj)


class PreferredMemory:
    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0):
        self.type, self.device = preferred_memory_type, preferred_device_id


class TritonError:
    def __init__(self, message: str, code=None):
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors, self._error = list(output_tensors), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error


class InferenceRequest:
    def __init__(self, model_name: str, inputs: list, requested_output_names: list,
                 preferred_memory: PreferredMemory | None = None):
        self.model_name, self.inputs = model_name, list(inputs)
        self.requested_output_names, self.preferred_memory = list(requested_output_names), preferred_memory

    def exec(self) -> InferenceResponse:
        return FAKE.serve(self)


def get_output_tensor_by_name(response: InferenceResponse, name: str):
    return next((t for t in response.output_tensors if t.name() == name), None)


# Which models exist and what they did: set by `install`.
FAKE = SimpleNamespace(models={}, calls=[], gpu_as_numpy=0, from_dlpack=0, serve=None)


def _serve(request: InferenceRequest) -> InferenceResponse:
    session = FAKE.models.get(request.model_name)
    if session is None:
        return InferenceResponse(error=TritonError(f"unknown model {request.model_name}"))
    # The engine reads its inputs wherever they lie (as TensorRT reads device pointers).
    feeds = {t.name(): np.from_dlpack(t) for t in request.inputs}
    outs = session.run(request.requested_output_names, feeds)
    gpu = request.preferred_memory is not None and request.preferred_memory.type == TRITONSERVER_MEMORY_GPU
    outputs = [Tensor(n, v, gpu=gpu) for n, v in zip(request.requested_output_names, outs)]
    FAKE.calls.append(SimpleNamespace(model=request.model_name, inputs={t.name(): t for t in request.inputs},
                                      outputs={t.name(): t for t in outputs}, gpu=gpu))
    return InferenceResponse(outputs)


def install(module, models: dict) -> SimpleNamespace:
    """Make the loaded generation `module` use this fake, serving `models` (name -> ORT session)."""
    import sys

    FAKE.models, FAKE.calls, FAKE.gpu_as_numpy, FAKE.from_dlpack, FAKE.serve = dict(models), [], 0, 0, _serve
    module.pb_utils = sys.modules[__name__]
    return FAKE
