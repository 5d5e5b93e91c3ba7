"""What the benchmarks share: the device and dtype checks, the timer, reading a policy record, pyplot."""

from __future__ import annotations

import statistics
from typing import Callable

from wide_export.errors import WideError

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
CPU_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # --device cpu: what wide_export.cpu's kernels take


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
