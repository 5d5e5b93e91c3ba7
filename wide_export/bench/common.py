"""What the benchmarks share: the device and dtype checks, the timer, reading a policy record, pyplot."""

from __future__ import annotations

import statistics
from typing import Callable

from wide_export.base.errors import WideError

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
CPU_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # --device cpu: what wide_export.cpu's kernels take


def _model_presets() -> dict:
    from wide_export.model.synthetic import SyntheticSpec

    return {
        # tests: 2 layers, hidden 128, head_dim 32 (what llama.cpp and vLLM's CPU attention take)
        "tiny": SyntheticSpec(arch="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
                              num_heads=4, num_kv_heads=2, attn_groups=2, ffn_groups=8, rank=16, seed=1),
        # a 0.37 B Llama (6 layers, hidden 2048, FFN 8192, 16 / 4 heads of 128, vocab 4096): 1.5 GB of float32
        # weights, 3x the last-level cache of the 2-core machine the CPU figures come from, so decode reads
        # them from memory. Groups: 2 heads (8 per layer), 128 FFN channels (64 per layer)
        "llama-0.4b": SyntheticSpec(arch="llama", vocab_size=4096, hidden_size=2048, intermediate_size=8192,
                                    num_layers=6, num_heads=16, num_kv_heads=4, attn_groups=8, ffn_groups=64,
                                    rank=64, max_position_embeddings=4096, seed=0),
    }


MODEL_PRESETS = _model_presets()  # whole random-weight checkpoints the generation benchmarks write


def decode_bytes(cfg, itemsize: int, skipped: dict[str, float]) -> int:
    """Weight bytes one decode token reads (cfg: a WideConfig): every layer's q/k/v, o, gate/up and down and
    the LM head (the embedding's one row aside); the routed parts scaled by the executed fraction
    1 - skipped[kind] (q and o of skipped head groups, gate/up and down of skipped channel groups; k and v
    are always read)."""
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    total = cfg.vocab_size * h
    for r in cfg.routing:
        attn = 1 - skipped.get("attention", 0.0) if r.attn_groups else 1.0
        ffn = 1 - skipped.get("ffn", 0.0) if r.ffn_groups else 1.0
        total += 2 * kv * h + attn * 2 * q * h + ffn * 3 * cfg.intermediate_size * h
    return int(total * itemsize)


def cuda_or_tiny(command: str, preset: str, hint: str = "run it on a machine with an NVIDIA GPU") -> bool:
    """True with a CUDA GPU; without one only the 'tiny' preset runs (CPU interpreter), else a WideError."""
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and preset != "tiny":
        raise WideError(f"`{command}` needs a CUDA GPU and none is visible",
                        hint=f"{hint}, or --preset tiny for a CPU run of the harness through the Triton interpreter")
    return cuda


def torch_dtype(dtype: str):
    """torch dtype of a --dtype value (fp16 or bf16)."""
    import torch

    if dtype not in TORCH_DTYPES:
        raise WideError(f"unknown dtype {dtype!r}", hint="fp16 or bf16")
    return getattr(torch, TORCH_DTYPES[dtype])


def time_ms(fn: Callable[[int], object], reps: int, warmup: int, cuda: bool) -> float:
    """Median milliseconds of fn(i); on a GPU the launches are queued behind a sleep."""
    import time

    import torch

    for i in range(warmup):
        fn(i)
    if not cuda:
        times = []
        for i in range(reps):
            t = time.perf_counter()
            fn(warmup + i)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time: the host enqueues everything meanwhile
    for i in range(reps):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def read_record(src, hint: str):
    """The JSON of a measured-policy record a benchmark wrote (`bench kernels --record FILE`); one WideError
    line when it is missing or not JSON."""
    import json
    from pathlib import Path

    try:
        return json.loads(Path(src).read_text())
    except FileNotFoundError:
        raise WideError(f"no policy record at {src}", hint=hint) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WideError(f"{src} is not a JSON policy record ({str(e).splitlines()[0]})", hint=hint) from None


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def model_rates(cases_ms, tokens: int, layers: int, model_layers: int) -> list[float]:
    """Whole-model tokens/s of each case: `tokens` through `layers` timed layers in ms, scaled to the model's
    `model_layers` (bench e2e times a few layers of a model's shapes)."""
    return [tokens / (ms / layers * model_layers * 1e-3) for ms in cases_ms]
