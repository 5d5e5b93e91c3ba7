"""What the plugin does inside vLLM before the engine starts: check the folder, fit the CPU KV cache.

vLLM calls a per-architecture hook (its `MODELS_CONFIG_MAP` of `VerifyAndUpdateConfig` classes) at the end of
`ModelConfig.__post_init__`, when it has parsed config.json and before it opens any other file of the model
(weights, tokenizer files, generation_config.json, chat template), and again from `VllmConfig.__post_init__`
with the whole engine configuration. `register` (the plugin's entry point) installs `WideGuard` there under
each WIDE architecture name, so `vllm serve OUT` and `vllm.LLM(model=OUT)` check the folder
(check.check_folder) where `wide-vllm serve` has not, and a folder that would fail later is refused first.
"""

from __future__ import annotations

import os
import sys

KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def _folder(model_config):
    """The local folder vLLM loads, or None (a hub repository id: its files arrive in the Hugging Face cache,
    whose snapshot links point into the same repository's blobs, and are checked at load)."""
    from pathlib import Path

    path = Path(str(model_config.model))
    return path if path.is_dir() else None


class WideGuard:
    """A `VerifyAndUpdateConfig` for the WIDE architectures (vLLM calls the two static methods)."""

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        from wide_export.base.errors import WideError
        from wide_export.vllm.check import check_folder

        folder = _folder(model_config)
        if folder is None:
            return
        try:
            check_folder(folder, hf=model_config.hf_config)
        except WideError as err:
            raise ValueError(f"WIDE: {err}") from None

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        fit_cpu_kv_cache(vllm_config)


def fit_cpu_kv_cache(vllm_config) -> None:
    """On vLLM's CPU backend, where the fraction of memory asked for (`--gpu-memory-utilization`, 0.92 by
    default: a fraction of the machine's whole memory there) is more than the memory free now and no KV cache
    size was given, size the KV cache from what is free (compat.cpu_kv_cache_bytes) instead of failing at
    startup, and say so on stderr. A configuration that fits is left as it is."""
    from vllm.platforms import current_platform

    cache = vllm_config.cache_config
    if not current_platform.is_cpu() or cache.kv_cache_memory_bytes is not None or os.environ.get(KV_ENV):
        return
    from wide_export.vllm.compat import cpu_kv_cache_bytes, memory_now, weights_bytes

    total, available = memory_now()
    if total * cache.gpu_memory_utilization <= available:
        return
    from wide_export.base.errors import WideError

    folder = _folder(vllm_config.model_config)
    try:
        kv, why = cpu_kv_cache_bytes(available, weights_bytes(folder) if folder else 0)
    except WideError as err:
        raise ValueError(f"WIDE: {err}") from None
    cache.kv_cache_memory_bytes = kv
    print(f"WIDE: CPU backend: --gpu-memory-utilization {cache.gpu_memory_utilization} asks for more memory than "
          f"is free; KV cache set to {kv / (1 << 30):.2f} GiB ({why}); pass --kv-cache-memory-bytes to choose",
          file=sys.stderr, flush=True)


def install(architectures: list[str]) -> None:
    """Put WideGuard under each WIDE architecture name in vLLM's per-architecture config hooks."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for name in architectures:
        MODELS_CONFIG_MAP.setdefault(name, WideGuard)
