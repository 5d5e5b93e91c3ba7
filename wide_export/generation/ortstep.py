"""The ONNX Runtime step of the generation model (copied as `<model>/1/ortstep.py`): model.onnx run
through an IOBinding, the KV cache left where the execution provider wrote it.

Self-contained (numpy, onnxruntime) like model.py, which loads it from its own folder."""

from __future__ import annotations

import os

import numpy as np

def ort_step(folder: str, settings, threads: int = 0):
    """A step function (settings.StepFn) running model.onnx in ONNX Runtime (CUDA EP when available).

    I/O goes through an IOBinding: `present.*` outputs are left where the
    execution provider wrote them (OrtValues on the GPU with the CUDA EP) and
    are bound as the next step's `past_key_values.*` inputs, so the KV cache
    never crosses the PCIe bus. Only input_ids / attention_mask / position_ids
    go in and `logits` comes back to host memory (the sampler runs in numpy).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(os.path.join(folder, settings.onnx_file), options, providers=providers)
    device = "cuda" if session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    present = [n for pair in settings.present_names() for n in pair]

    def step(feeds: dict, phase: str) -> tuple:
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):  # a previous step's present, already on the device
                binding.bind_ortvalue_input(name, value)
            elif isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:  # a torch tensor the in-flight batch built on the device: bound where it lies
                _bind_torch_input(binding, name, value)
        binding.bind_output(settings.io["logits"], "cpu")
        for name in present:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding)
        outs = binding.get_outputs()
        presents = [(outs[1 + 2 * i], outs[2 + 2 * i]) for i in range(settings.num_layers)]
        return outs[0].numpy(), presents

    step.device = device
    return step


def _bind_torch_input(binding, name: str, tensor) -> None:
    """Bind a (C-contiguous) torch tensor as an input by pointer, on its own device: no copy.
    IOBinding.bind_input(name, device_type, device_id, element_type, shape, buffer_ptr); the
    caller's feeds keep the tensor alive until the run ends."""
    if not tensor.is_contiguous():  # a copy made here would be freed before the run
        raise ValueError(f"{name}: cache tensor is not contiguous")
    dtype = np.dtype(str(tensor.dtype).replace("torch.", ""))
    device = tensor.device
    binding.bind_input(name, device.type, device.index or 0, dtype, list(tensor.shape), tensor.data_ptr())
