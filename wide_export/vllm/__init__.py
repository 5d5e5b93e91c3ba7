"""WIDE in vLLM: the folder `wide-export vllm` writes (export.py, spec.py) and the plugin that runs it.

Installing wide-export registers `register` under the `vllm.general_plugins`
entry point; vLLM calls it in every process it starts (API server, engine core,
tensor / pipeline parallel workers), so `vllm serve OUT` finds our architecture
names. Nothing here imports vLLM or torch until vLLM asks for the model class.
"""

from __future__ import annotations

MODEL_CLASS = "wide_export.vllm.model:WideForCausalLM"


def architectures() -> list[str]:
    """The architecture names a WIDE vLLM folder may declare, one per family of model/arch.py's table."""
    from wide_export.model.arch import ARCHS

    return [spec.vllm_architecture for spec in ARCHS.values()]


def register() -> None:
    """vLLM plugin entry point: register the WIDE model class under each family's architecture name (lazily,
    by import path: vLLM imports it only when a folder names one of them), and the checks vLLM runs for them
    before it reads the folder (guard.py)."""
    from vllm import ModelRegistry

    from wide_export.vllm.guard import install

    known = set(ModelRegistry.get_supported_archs())
    for name in architectures():
        if name not in known:
            ModelRegistry.register_model(name, MODEL_CLASS)
    install(architectures())  # the folder's checks before vLLM opens its files (guard.py)
