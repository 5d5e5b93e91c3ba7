"""The masked projections on CPU tensors: the compiled kernels (wide_cpu.cpp) where policy.json says they
win, else the dense GEMM with the mask applied; both match wide_export.ops.reference.

Where no C++ compiler is found the kernels cannot be built: every call then takes the dense path, and one
warning line says so once per process (a benchmark must not report the dense path as WIDE's). `PATHS`
counts which path served each call, for the benchmarks to print."""

from __future__ import annotations

import collections
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from wide_export.errors import WideError

POLICY_FILE = Path(__file__).with_name("policy.json")
PATHS: collections.Counter = collections.Counter()  # (kind, "masked" | "dense") -> calls
_DTYPES = (torch.float32, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _load() -> str:
    """Build (once per source / torch / compiler) and load the library; '' and one warning line when it
    cannot be built. Raises nothing: a missing compiler must not stop generation, only slow it."""
    from wide_export.cpu.build import library_path

    try:
        torch.ops.load_library(str(library_path()))
    except WideError as err:
        print(f"warning: {err}; the masked projections run dense (torch GEMM + mask) on CPU, without WIDE's "
              f"speed-up", file=sys.stderr)
        return ""
    for name in ("gemm_n", "gemm_k", "gated"):
        torch.library.register_fake(f"wide_cpu::{name}")(_fake)
    return torch.ops.wide_cpu.isa()


def _fake(*_args, **_kwargs) -> None:  # the ops write `out` in place and return nothing
    return None


def available() -> bool:
    """Whether the compiled kernels are loaded (compiling them on first call)."""
    return bool(_load())


def isa() -> str:
    """The instruction set the kernels use on this CPU ('avx2+fma f16c', 'scalar', ...; '' if not built)."""
    return _load()


@functools.lru_cache(maxsize=None)
def policy() -> dict:
    table = json.loads(POLICY_FILE.read_text())
    return table.get(cpu_model(), table["default"])


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), the key of its measured policy entry."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _masked(kind: str, x2: torch.Tensor, w: torch.Tensor, mask2: torch.Tensor, force: str | None) -> bool:
    if force is not None:
        if force not in ("masked", "dense"):
            raise ValueError(f"path must be 'masked' or 'dense', got {force!r}")
        if force == "masked" and not available():
            raise WideError("the CPU kernels are not built (no C++ compiler)", hint="install g++ or set CXX")
        return force == "masked"
    if x2.device.type != "cpu" or x2.dtype not in _DTYPES or w.dtype != x2.dtype or not available():
        return False
    p = policy()
    M = x2.shape[0]
    if M > p["masked_max_m"][kind]:
        return False
    return M == 1 or float(mask2.any(0).float().mean()) < p["dense_union_min"]


def _flat(x: torch.Tensor, mask: torch.Tensor):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m2 = mask.reshape(-1, mask.shape[-1])
    return x2, (m2 if m2.dtype == torch.int32 else m2.to(torch.int32)).contiguous()


def _expand(mask2: torch.Tensor, group_size: int, dtype) -> torch.Tensor:
    return mask2.to(dtype).repeat_interleave(group_size, dim=-1)


def masked_gemm_n(x, w, mask, group_size: int, bias=None, out=None, path: str | None = None):
    """(x W^T + b) with the outputs of skipped groups exactly 0; x [.., K], w [N, K], mask [.., N/group_size]."""
    x2, m2 = _flat(x, mask)
    if _masked("n", x2, w, m2, path):
        PATHS["n", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], w.shape[0])
        torch.ops.wide_cpu.gemm_n(x2, w.contiguous(), m2, group_size, bias, y)
    else:
        PATHS["n", "dense"] += 1
        y = F.linear(x2, w, bias) * _expand(m2, group_size, x2.dtype)
    return y.reshape(*x.shape[:-1], w.shape[0])


def masked_gated_mlp(x, w_gate, w_up, mask, group_size: int, out=None, path: str | None = None):
    """silu(x Wg^T) * (x Wu^T) with the channels of skipped groups exactly 0."""
    x2, m2 = _flat(x, mask)
    if _masked("gated", x2, w_gate, m2, path):
        PATHS["gated", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], w_gate.shape[0])
        torch.ops.wide_cpu.gated(x2, w_gate.contiguous(), w_up.contiguous(), m2, group_size, y)
    else:
        PATHS["gated", "dense"] += 1
        y = F.silu(F.linear(x2, w_gate)) * F.linear(x2, w_up) * _expand(m2, group_size, x2.dtype)
    return y.reshape(*x.shape[:-1], w_gate.shape[0])


def masked_gemm_k(x, w, mask, group_size: int, bias=None, out=None, path: str | None = None):
    """x W^T + b over the input groups each token executes (skipped input columns ignored)."""
    x2, m2 = _flat(x, mask)
    if _masked("k", x2, w, m2, path):
        PATHS["k", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], w.shape[0])
        torch.ops.wide_cpu.gemm_k(x2, w.contiguous(), m2, group_size, bias, y)
    else:
        PATHS["k", "dense"] += 1
        y = F.linear(x2 * _expand(m2, group_size, x2.dtype), w, bias)
    return y.reshape(*x.shape[:-1], w.shape[0])


def router(hidden, wc, bc, wr, br):
    """The router on CPU: two small GEMMs and the execute rule, in float32 (torch ops; its weights are ~1 %
    of a layer's, so a kernel of its own is not where decode time goes)."""
    from wide_export.ops.reference import wide_router

    return wide_router(hidden, wc, bc, wr, br)
