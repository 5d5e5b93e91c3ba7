"""Launch the Triton kernels of ``triton_kernels.py`` on torch tensors.

CUDA tensors run the JIT-compiled kernels; CPU tensors run the same kernels
under Triton's interpreter (``TRITON_INTERPRET=1``, set automatically on a
machine without CUDA before the kernels are first imported). Nothing here
falls back to the PyTorch references: ``algo="dense"`` is the explicit cuBLAS
path (torch.matmul plus the mask), the floor the sparse algorithms must beat.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from wide_export.base.errors import WideError
from wide_export.kernels import configs as cfg
from wide_export.kernels.mode import INTERPRET_ENV
from wide_export.kernels.policy import ALGOS, choose, policy_for, tile_size

if TYPE_CHECKING:
    import torch


def _torch():
    import torch

    return torch


@functools.lru_cache(maxsize=None)
def kernels():
    """The kernel module; imported under the interpreter when this machine has no CUDA."""
    torch = _torch()
    if not torch.cuda.is_available() and os.environ.get(INTERPRET_ENV) is None:
        os.environ[INTERPRET_ENV] = "1"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as the AOT build; silences Triton 3.9's warning
    from wide_export.kernels import triton_kernels

    if _is_interpreted(triton_kernels.wide_cast_kernel):
        _interpreter_scalar_index_compat()
    if _is_interpreted(triton_kernels.wide_cast_kernel) and _is_compiled_mode(_tl_zeros()):
        # triton.language was imported before the variable was set: its own @jit helpers are compiled-mode.
        raise WideError("Triton was imported before the CPU interpreter was switched on",
                        hint=f"set {INTERPRET_ENV}=1 in the environment before starting Python")
    return triton_kernels


def _interpreter_scalar_index_compat() -> None:
    """Triton < 3.7's interpreter: ``range(0, K, BLOCK)`` over a scalar argument with numpy >= 2.4.

    The interpreter holds a scalar as a 1-element array and its ``tensor.__index__`` is
    ``int(array)``, which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
    scalars"): every kernel with a loop over a scalar bound failed. Triton 3.7 squeezes the array
    first; this installs that same ``__index__`` on older interpreters (and nothing on newer ones).
    """
    import triton
    from triton.runtime import interpreter as ti

    if tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit()) >= (3, 7):
        return
    orig = getattr(ti, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_wide_squeeze_index", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._wide_squeeze_index = True
    ti._patch_lang_tensor = patched


def _tl_zeros():
    import triton.language as tl

    return tl.zeros


def _is_compiled_mode(fn) -> bool:
    from triton.runtime.jit import JITFunction

    return isinstance(fn, JITFunction) and not _is_interpreted(fn)


def _is_interpreted(fn) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


def interpreted() -> bool:
    """True when the kernels run in Triton's CPU interpreter (CPU tensors)."""
    return _is_interpreted(kernels().wide_cast_kernel)


def arch_of(device) -> str:
    if device.type != "cuda":
        return "interpreter"
    major, minor = _torch().cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def device_name(device) -> Optional[str]:
    """The GPU model's name (its own policy entry's key, policy.device_key); None off CUDA."""
    if device.type != "cuda":
        return None
    return _device_name(device.index if device.index is not None else _torch().cuda.current_device())


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return _torch().cuda.get_device_name(index)


def policy_of(device) -> dict:
    """The policy `auto` follows on `device`: its GPU model's entry, else its architecture's (policy_for)."""
    return policy_for(arch_of(device), device_name(device))


def _check_device(*tensors) -> None:
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = next(iter(devices))
    if device.type == "cuda":
        if interpreted():
            raise WideError("the Triton kernels were loaded for the CPU interpreter; CUDA tensors cannot run",
                            hint=f"unset {INTERPRET_ENV} on a GPU machine")
    elif device.type == "cpu":
        if not interpreted():
            raise WideError("CPU tensors run the kernels in Triton's interpreter, which is off in this process",
                            hint=f"set {INTERPRET_ENV}=1 before importing wide_export.kernels, or use CUDA tensors")
    else:
        raise ValueError(f"tensors must be on CPU or CUDA, got {device}")


# ---------------------------------------------------------------------------
# Validation (no kernel, no device)
_FLOATS = ("float32", "float16", "bfloat16")


def _float_dtype(t, name: str) -> None:
    if str(t.dtype).replace("torch.", "") not in _FLOATS:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def _tensor(t, name: str):
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _weight(w, name: str, N: Optional[int] = None, K: Optional[int] = None):
    _tensor(w, name)
    if w.dim() != 2 or (N is not None and w.shape[0] != N) or (K is not None and w.shape[1] != K):
        want = f"[{N if N is not None else 'N'}, {K if K is not None else 'K'}]"
        raise ValueError(f"{name} must be a 2-D {want} tensor, got shape {tuple(w.shape)}")
    return w.contiguous()


def _like_x(t, name: str, x) -> None:
    if t.dtype != x.dtype:
        raise ValueError(f"{name} must have dtype {x.dtype} like x, got {t.dtype}")


def _group_count(width: int, group_size: int, axis: str) -> int:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if width % group_size:
        raise ValueError(f"{axis} = {width} is not a multiple of group_size = {group_size}")
    return width // group_size


def _mask(mask, lead: tuple, G: int):
    torch = _torch()
    _tensor(mask, "mask")
    if mask.dtype != torch.int32:
        raise ValueError(f"mask must be int32, got {mask.dtype}")
    if tuple(mask.shape) != lead + (G,):
        raise ValueError(f"mask must have shape {lead + (G,)}, got {tuple(mask.shape)}")
    return mask.reshape(-1, G).contiguous()


def _rows(x, name: str, K: int):
    _tensor(x, name)
    _float_dtype(x, name)
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"{name} must have last dimension {K}, got shape {tuple(x.shape)}")
    return x.reshape(-1, K).contiguous()


def _pick(kind: str, algo: str, M: int, group_size: int, device, N: int, K: int) -> str:
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {list(ALGOS)}, got {algo!r}")
    if algo == "auto":
        return choose(kind, M, group_size, policy_of(device), N, K)
    if algo == "grouped" and kind != "k" and not cfg.grouped_block_n(group_size):
        raise ValueError(f"the grouped algorithm needs group_size % {cfg.GROUPED_BLOCK_NS[-1]} == 0, "
                         f"got {group_size}; use algo='tile'")
    return algo


TILES = ("auto", *cfg.SIZES)


def _size(tiles: str, fam: str, M: int, x, aligned: bool) -> str:
    """The size class (configs.SIZES) of this prefill GEMM: `tiles` "auto" takes the policy's prefill_tiles
    bucket for M, a size forces one (benchmarks; "wide" on a family without it: its largest, "large");
    either is stepped down by configs.size_for where the architecture, dtype or alignment lacks it (the C
    runtime's rule; a forced size only for the alignment and the dtype: the interpreter and benchmarks may
    run the large tiles on any GPU)."""
    dtype = str(x.dtype)[6:]
    if tiles == "auto":
        return cfg.size_for(fam, tile_size(fam, M, policy_of(x.device)), arch_of(x.device), dtype, aligned)
    if tiles != "small" and dtype == "float32":
        raise ValueError(f"float32 has no {tiles} tile (it is the precise path); use tiles='auto'")
    sizes = cfg.TILE_FAMILIES[fam]
    return cfg.size_for(fam, tiles if tiles in sizes else sizes[-1], "interpreter", dtype, aligned)


def _check_tiles(tiles: str) -> None:
    if tiles not in TILES:
        raise ValueError(f"tiles must be one of {list(TILES)}, got {tiles!r}")


def _precise(dtype) -> bool:
    """IEEE float32 products for fp32 data; bf16 dots run upcast in the interpreter (numpy has no bf16)."""
    torch = _torch()
    return dtype == torch.float32 or (dtype == torch.bfloat16 and interpreted())


def _aligned(*tensors, ints=()) -> bool:
    """Whether Triton will specialize this call as 16-aligned (its data pointers and dimensions): the tile
    of the matching AOT variant (configs.py, "Alignment"), chosen by the same rule as the C runtime."""
    return cfg.is_aligned(*(t.data_ptr() for t in tensors if t is not None), *ints)


def _launch(kernel, grid, *args, num_warps: int, num_stages: int = cfg.STAGES, **constexprs):
    kernel[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)


def sm_count(device) -> int:
    """Streaming multiprocessors the decode grids are planned for: the GPU's, else the H200's (132)."""
    if device.type == "cuda":
        return _torch().cuda.get_device_properties(device).multi_processor_count
    return cfg.DECODE_SMS


# ---------------------------------------------------------------------------
# Decode launch plans: pure functions of the shapes (the launches below and tests/kernels/test_decode_grid.py)
@dataclass(frozen=True)
class DecodePlan:
    """How a decode kernel is launched: its grid and how K (or H) is split across programs."""

    kernel: str
    grid: tuple
    splits: int = 1               # programs along K sharing one output tile (grid[2])
    chunks_per_split: int = 0     # K (H) chunks of BLOCK_K (BLOCK_H) per split; 0 = no split loop

    @property
    def ctas(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    def waves(self, sms: int = cfg.DECODE_SMS) -> float:
        return self.ctas / sms


def _split(programs: int, chunks: int, sms: int, max_splits: Optional[int] = None) -> tuple[int, int]:
    """(splits, chunks per split): split `chunks` K chunks until programs * splits reaches the target waves."""
    want = max(1, -(-cfg.DECODE_TARGET_WAVES * sms // max(programs, 1)))
    splits = max(1, min(want, chunks, max_splits or chunks))
    per = -(-chunks // splits)
    return -(-chunks // per), per


def gemv_n_plan(M: int, N: int, K: int, sms: int = cfg.DECODE_SMS, max_splits: Optional[int] = None) -> DecodePlan:
    """N-pruned / gated GEMV: (token, GEMV_BLOCK_N outputs, split) programs, tokens fastest so a weight tile's
    tokens run together; K split into whole GEMV_BLOCK_K chunks only while the grid is under
    DECODE_TARGET_WAVES waves (q at T = 1: 2 splits; gate/up: none)."""
    tiles = triton_cdiv(N, cfg.GEMV_BLOCK_N)
    splits, per = _split(M * tiles, triton_cdiv(K, cfg.GEMV_BLOCK_K), sms, max_splits)
    return DecodePlan("wide_gemv_n_kernel", (M, tiles, splits), splits, per)


def gemv_k_plan(M: int, N: int, K: int, sms: int = cfg.DECODE_SMS, max_splits: Optional[int] = None) -> DecodePlan:
    """K-pruned GEMV, split-K: (token, GEMV_K_BLOCK_N outputs, split) programs; K is cut into splits of whole
    GEMV_K_BLOCK_K chunks until the grid reaches DECODE_TARGET_WAVES waves (max_splits: what the workspace
    holds)."""
    tiles = triton_cdiv(N, cfg.GEMV_K_BLOCK_N)
    splits, per = _split(M * tiles, triton_cdiv(K, cfg.GEMV_K_BLOCK_K), sms, max_splits)
    return DecodePlan("wide_gemv_k_kernel", (M, tiles, splits), splits, per)


def router_plan(M: int, H: int, R: int, sms: int = cfg.DECODE_SMS) -> DecodePlan:
    """Router: up to ROUTER_SPLIT_MAX_M tokens, the compressor split over (token tile, 8 rows of Wc, H slices);
    above, the fused one-pass router (one program per 16 tokens)."""
    if M > cfg.ROUTER_SPLIT_MAX_M:
        return DecodePlan("wide_router_kernel", (triton_cdiv(M, cfg.ROUTER_BLOCK_M), 1, 1))
    programs = triton_cdiv(M, cfg.ROUTER_SPLIT_BLOCK_M) * triton_cdiv(R, cfg.ROUTER_SPLIT_BLOCK_R)
    splits, per = _split(programs, triton_cdiv(H, cfg.ROUTER_SPLIT_BLOCK_H), sms)
    return DecodePlan("wide_router_split_kernel", (triton_cdiv(M, cfg.ROUTER_SPLIT_BLOCK_M),
                                                   triton_cdiv(R, cfg.ROUTER_SPLIT_BLOCK_R), splits), splits, per)


# ---------------------------------------------------------------------------
# Router
def router(x, wc, bc, wr, br):
    """WideRouter: int32 mask [..., G], 1 where logit 0 >= logit 1 (docs/opset.md)."""
    torch = _torch()
    _tensor(x, "hidden")
    _float_dtype(x, "hidden")
    H = x.shape[-1]
    wc = _weight(wc, "compressor weight", K=H)
    R = wc.shape[0]
    wr = _weight(wr, "router weight", K=R)
    if wr.shape[0] % 2:
        raise ValueError(f"router weight must have 2G rows, got {wr.shape[0]}")
    G = wr.shape[0] // 2
    for name, t, n in (("compressor bias", bc, R), ("router bias", br, 2 * G)):
        _tensor(t, name)
        if t.dim() != 1 or t.shape[0] != n:
            raise ValueError(f"{name} must be [{n}], got shape {tuple(t.shape)}")
    for name, t in (("compressor weight", wc), ("compressor bias", bc), ("router weight", wr), ("router bias", br)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (routers run in float32), got {t.dtype}")
    block_r = cfg.router_block_r(R)
    if not block_r:
        raise ValueError(f"router rank R = {R} is above the fused router's limit {cfg.ROUTER_BLOCK_RS[-1]}")
    x2 = x.reshape(-1, H).contiguous()
    M = x2.shape[0]
    _check_device(x2, wc, bc, wr, br)
    out = torch.empty((M, G), dtype=torch.int32, device=x.device)
    if not M:
        return out.reshape(*x.shape[:-1], G)
    ks = kernels()
    plan = router_plan(M, H, R, sm_count(x.device))
    if plan.kernel == "wide_router_kernel":
        block_h, warps = cfg.router_tile(block_r)
        _launch(ks.wide_router_kernel, plan.grid, x2, wc, bc.contiguous(), wr, br.contiguous(), out,
                M, H, R, G, H, num_warps=warps, BLOCK_M=cfg.ROUTER_BLOCK_M,
                BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_G=cfg.ROUTER_BLOCK_G)
    else:
        part = torch.empty((plan.splits, M, R), dtype=torch.float32, device=x.device)
        _launch(ks.wide_router_split_kernel, plan.grid, x2, wc, part, M, H, R, H, plan.chunks_per_split,
                num_warps=cfg.ROUTER_SPLIT_WARPS, BLOCK_M=cfg.ROUTER_SPLIT_BLOCK_M, BLOCK_R=cfg.ROUTER_SPLIT_BLOCK_R,
                BLOCK_H=cfg.ROUTER_SPLIT_BLOCK_H)
        _launch(ks.wide_router_logits_kernel, (triton_cdiv(M, cfg.ROUTER_BLOCK_M),), part, bc.contiguous(), wr,
                br.contiguous(), out, M, R, G, plan.splits, num_warps=cfg.ROUTER_WARPS,
                BLOCK_M=cfg.ROUTER_BLOCK_M, BLOCK_R=block_r, BLOCK_G=cfg.ROUTER_BLOCK_G)
    return out.reshape(*x.shape[:-1], G)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# Row lists per group (the "mask reordering" of the grouped algorithms)
def group_rows(mask2d):
    """(rows int32 [G, M]: executing rows first, ascending, then the others; counts int32 [G])."""
    torch = _torch()
    M, G = mask2d.shape
    rows = torch.empty((G, M), dtype=torch.int32, device=mask2d.device)
    counts = torch.empty((G,), dtype=torch.int32, device=mask2d.device)
    _launch(kernels().wide_group_rows_kernel, (G,), mask2d, rows, counts, M, G, num_warps=4,
            BLOCK=cfg.GROUP_ROWS_BLOCK)
    return rows, counts


# ---------------------------------------------------------------------------
# Masked GEMMs
def _gemm_n(kind: str, x, w, w2, mask, group_size: int, bias, algo: str, tiles: str = "auto"):
    torch = _torch()
    w = _weight(w, "weight" if kind == "n" else "gate weight")
    N, K = w.shape
    x2 = _rows(x, "x", K)
    _like_x(w, "weight", x)
    if w2 is not None:
        w2 = _weight(w2, "up weight", N, K)
        _like_x(w2, "up weight", x)
    if bias is not None:
        _tensor(bias, "bias")
        if bias.dim() != 1 or bias.shape[0] != N or bias.dtype != x.dtype:
            raise ValueError(f"bias must be a [{N}] {x.dtype} tensor, got {tuple(bias.shape)} {bias.dtype}")
        bias = bias.contiguous()
    G = _group_count(N, group_size, "N")
    lead = tuple(x.shape[:-1])
    m2 = _mask(mask, lead, G)
    M = x2.shape[0]
    _check_device(x2, w, w2, bias, m2)
    how = _pick(kind, algo, M, group_size, x.device, N, K)
    _check_tiles(tiles)
    gated = w2 is not None
    if how == "dense":
        y = _dense_n(x2, w, w2, bias, m2, group_size)
        return y.reshape(*lead, N)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*lead, N)
    ks = kernels()
    dummy = w  # never read: HAS_BIAS / GATED are constexpr False
    common = dict(HAS_BIAS=bias is not None, GATED=gated)
    if how == "gemv":
        plan = gemv_n_plan(M, N, K, sm_count(x.device))
        # split-K partials (gated: gate then up), summed and finished (silu * up, mask zeros) in split order
        part = torch.empty(((2 if gated else 1) * plan.splits, M, N) if plan.splits > 1 else (1,),
                           dtype=torch.float32, device=x.device)
        _launch(ks.wide_gemv_n_kernel, plan.grid, x2, w, w2 if gated else dummy,
                bias if bias is not None else dummy, m2, y, part, M, N, K, G, group_size, K, plan.chunks_per_split,
                num_warps=cfg.GEMV_WARPS, **common, BLOCK_N=cfg.GEMV_BLOCK_N, BLOCK_K=cfg.GEMV_BLOCK_K)
        if plan.splits > 1:  # the bias is already in split 0's partial (executing outputs only)
            _launch(ks.wide_splitk_reduce_kernel, (triton_cdiv(M * N, cfg.SPLITK_REDUCE_BLOCK),), part, dummy, y,
                    M * N, N, plan.splits, num_warps=4, HAS_BIAS=False, GATED=gated, BLOCK=cfg.SPLITK_REDUCE_BLOCK)
    elif how == "grouped":
        rows, counts = group_rows(m2)
        aligned = _aligned(x2, w, w2, bias, y, ints=(N, K, group_size))
        t = cfg.grouped_n_tile(group_size, gated, aligned, _size(tiles, cfg.family(kind, "grouped"), M, x, aligned))
        grid = (triton_cdiv(M, t.block_m), N // t.block_n)
        _launch(ks.wide_grouped_gemm_n_kernel, grid, x2, w, w2 if gated else dummy,
                bias if bias is not None else dummy, rows, counts, y, M, N, K, group_size, K,
                num_warps=t.num_warps, num_stages=t.num_stages, **common, PRECISE=_precise(x.dtype),
                BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
    else:  # tile
        aligned = _aligned(x2, w, w2, bias, m2, y, ints=(N, K, group_size))
        t = cfg.tile_tile(str(x.dtype)[6:], gated, aligned, _size(tiles, cfg.family(kind, "tile"), M, x, aligned))
        grid = (triton_cdiv(M, t.block_m), triton_cdiv(N, t.block_n))
        _launch(ks.wide_tile_gemm_n_kernel, grid, x2, w, w2 if gated else dummy,
                bias if bias is not None else dummy, m2, y, M, N, K, G, group_size, K,
                num_warps=t.num_warps, num_stages=t.num_stages, **common, PRECISE=_precise(x.dtype),
                BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=cfg.TILE_GROUP_M)
    return y.reshape(*lead, N)


def _dense_n(x2, w, w2, bias, m2, group_size):
    """cuBLAS (torch) and the mask: what the dense model computes, plus one elementwise pass."""
    F = _torch().nn.functional
    y = F.linear(x2, w, bias)
    if w2 is not None:
        y = F.silu(y).mul_(F.linear(x2, w2))
    M, N = y.shape
    y.view(M, N // group_size, group_size).mul_(m2.to(y.dtype).unsqueeze(-1))
    return y


def masked_gemm_n(x, w, mask, group_size: int, bias=None, *, algo: str = "auto", tiles: str = "auto"):
    """WideMaskedGemmN: (x W^T + b) * mask per output group; [..., K] -> [..., N]. `tiles`: the prefill
    GEMMs' size class, "auto" (the policy's prefill_tiles buckets), "small", "large" or "wide"."""
    return _gemm_n("n", x, w, None, mask, group_size, bias, algo, tiles)


def masked_gated_mlp(x, w_gate, w_up, mask, group_size: int, *, algo: str = "auto", tiles: str = "auto"):
    """WideMaskedGatedMlp: silu(x Wg^T) * (x Wu^T) * mask per output group."""
    if w_up is None:
        raise ValueError("the gated MLP needs the up weight")
    return _gemm_n("gated", x, w_gate, w_up, mask, group_size, None, algo, tiles)


def _bias(bias, N: int, x):
    if bias is None:
        return None
    _tensor(bias, "bias")
    if bias.dim() != 1 or bias.shape[0] != N or bias.dtype != x.dtype:
        raise ValueError(f"bias must be a [{N}] {x.dtype} tensor, got {tuple(bias.shape)} {bias.dtype}")
    return bias.contiguous()


def masked_gemm_k(x, w, mask, group_size: int, bias=None, *, algo: str = "auto", tiles: str = "auto"):
    """WideMaskedGemmK: inputs of skipped groups ignored, y = x_masked W^T + b; [..., K] -> [..., N]."""
    torch = _torch()
    w = _weight(w, "weight")
    N, K = w.shape
    x2 = _rows(x, "x", K)
    _like_x(w, "weight", x)
    bias = _bias(bias, N, x)
    G = _group_count(K, group_size, "K")
    lead = tuple(x.shape[:-1])
    m2 = _mask(mask, lead, G)
    M = x2.shape[0]
    _check_device(x2, w, bias, m2)
    how = _pick("k", algo, M, group_size, x.device, N, K)
    _check_tiles(tiles)
    if how == "dense":
        keep = m2.bool().repeat_interleave(group_size, dim=1)
        return torch.nn.functional.linear(x2.masked_fill(~keep, 0), w, bias).reshape(*lead, N)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return y.reshape(*lead, N)
    ks = kernels()
    b = bias if bias is not None else w  # never read when HAS_BIAS is False
    has_bias = bias is not None
    if how == "gemv":
        plan = gemv_k_plan(M, N, K, sm_count(x.device))
        # split-K partials: written by every split (no zeroing), summed in split order (deterministic, no atomics)
        part = torch.empty((plan.splits, M, N) if plan.splits > 1 else (1,), dtype=torch.float32, device=x.device)
        _launch(ks.wide_gemv_k_kernel, plan.grid, x2, w, b, m2, y, part, M, N, K, G, group_size, K,
                plan.chunks_per_split, num_warps=cfg.GEMV_WARPS, HAS_BIAS=has_bias, BLOCK_N=cfg.GEMV_K_BLOCK_N,
                BLOCK_K=cfg.GEMV_K_BLOCK_K)
        if plan.splits > 1:
            _launch(ks.wide_splitk_reduce_kernel, (triton_cdiv(M * N, cfg.SPLITK_REDUCE_BLOCK),), part, b, y,
                    M * N, N, plan.splits, num_warps=4, HAS_BIAS=has_bias, GATED=False, BLOCK=cfg.SPLITK_REDUCE_BLOCK)
    elif how == "grouped":
        rows, counts = group_rows(m2)
        t = cfg.grouped_k_tile(_aligned(x2, w, ints=(N, K, group_size)))
        acc = torch.zeros((M, N), dtype=torch.float32, device=x.device)
        grid = (triton_cdiv(M, t.block_m), triton_cdiv(N, t.block_n), G)
        _launch(ks.wide_grouped_gemm_k_kernel, grid, x2, w, rows, counts, acc, M, N, K, group_size, K,
                num_warps=t.num_warps, num_stages=t.num_stages, PRECISE=_precise(x.dtype),
                BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
        _launch(ks.wide_cast_kernel, (triton_cdiv(M * N, cfg.CAST_BLOCK),), acc, y, b, M * N, N, num_warps=4,
                HAS_BIAS=has_bias, BLOCK=cfg.CAST_BLOCK)
    else:  # tile
        aligned = _aligned(x2, w, bias, m2, y, ints=(N, K, group_size))
        t = cfg.tile_tile(str(x.dtype)[6:], aligned=aligned,
                          size=_size(tiles, cfg.family("k", "tile"), M, x, aligned))
        grid = (triton_cdiv(M, t.block_m), triton_cdiv(N, t.block_n))
        _launch(ks.wide_tile_gemm_k_kernel, grid, x2, w, b, m2, y, M, N, K, G, group_size, K,
                num_warps=t.num_warps, num_stages=t.num_stages, HAS_BIAS=has_bias, PRECISE=_precise(x.dtype),
                BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, GROUP_M=cfg.TILE_GROUP_M)
    return y.reshape(*lead, N)
