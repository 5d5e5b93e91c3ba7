"""The masked projections on CPU tensors: the compiled kernels (cpu/csrc/) where policy.json says they
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

from wide_export.base.errors import WideError

POLICY_FILE = Path(__file__).with_name("policy.json")
PATHS: collections.Counter = collections.Counter()  # (kind, "masked" | "dense") -> calls
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=None)
def _load() -> str:
    """Build (once per source / torch / compiler) and load the library; '' and one warning line when it
    cannot be built or loaded. Raises only build.UnsafeCache (a cache another user could write): a missing
    compiler must not stop generation, only slow it."""
    from wide_export.cpu.build import UnsafeCache, load

    try:
        load()  # a library the loader refuses is rebuilt once
    except UnsafeCache:
        raise
    except WideError as err:
        print(f"warning: {err}; the masked projections run dense (torch GEMM + mask) on CPU, without WIDE's "
              f"speed-up", file=sys.stderr)
        return ""
    for name in ("gemm_n", "gemm_k", "gemm_kt", "gated", "router"):
        torch.library.register_fake(f"wide_cpu::{name}")(_fake)
    return torch.ops.wide_cpu.isa()


def _fake(*_args, **_kwargs) -> None:  # the ops write `out` in place and return nothing
    return None


class KernelArgumentError(WideError, RuntimeError):
    """Arguments a wide_cpu op refused: a WideError (the CLI prints one line with the hint) that is still the
    RuntimeError the op raised, for callers that catch that."""


def run_op(name: str, *args):
    """torch.ops.wide_cpu.<name>(*args). An argument the op refuses (it checks every one before it reads or writes
    memory; one RuntimeError line naming the op) is raised as a KernelArgumentError: one line with a hint, no
    traceback."""
    try:
        return getattr(torch.ops.wide_cpu, name)(*args)
    except RuntimeError as err:
        lines = str(err).strip().splitlines()
        if not lines or not lines[0].startswith("wide_cpu::"):
            raise
        raise KernelArgumentError(f"the CPU kernel refused its arguments: {lines[0]}",
                                  hint="the tensors' shapes, dtypes or group sizes do not fit the kernel; check "
                                       "the model's config.json and router file") from None


def available() -> bool:
    """Whether the compiled kernels are loaded (compiling them on first call)."""
    return bool(_load())


def require(why: str) -> None:
    """Load the kernels, or one WideError saying they cannot be built and `why` that matters (for a benchmark,
    which must not time the dense path as WIDE's): no compiler is refused here, before available() would
    warn and go on dense."""
    from wide_export.cpu.build import find_compiler

    try:
        find_compiler()
    except WideError as err:
        raise WideError(f"the CPU kernels could not be built ({err.message}){why}",
                        hint="install g++ (or set CXX) and run it again") from None
    available()


def isa() -> str:
    """The instruction set the kernels use ('avx512bf16', 'avx512', 'avx2', 'scalar'; a lower one than the CPU's
    best is followed by '(of BEST)'; '' when the library could not be built)."""
    return _load()


@functools.lru_cache(maxsize=None)
def policy(dtype: str = "float32") -> dict:
    """This CPU model's entry for weights of `dtype` (policy.json: masked_max_m, dense_union_min and
    masked_full_union_min_m; the `default` entry for a CPU model or dtype not measured)."""
    table = read_table()
    return table.get(cpu_model(), {}).get(dtype) or table["default"][dtype]


def read_table(path: Path | None = None) -> dict:
    """cpu/policy.json (or a copy at `path`) as it is on disk: the one reader of the file."""
    return json.loads(Path(path or POLICY_FILE).read_text())


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
    return choose(kind, x2.shape[0], str(x2.dtype)[6:], lambda: float(mask2.any(0).float().mean())) == "masked"


def choose(kind: str, M: int, dtype: str, union) -> str:
    """'masked' or 'dense' for a call of M tokens (union(): the fraction of groups some token executes, asked
    only when it matters), by policy.json: masked up to masked_max_m tokens, unless the union reaches
    dense_union_min, where the call reads every group's weights anyway; except from masked_full_union_min_m
    to masked_full_union_max_m tokens (default masked_max_m), where the masked kernel wins even at a full
    union (a dense GEMM of a few tokens is slow, as float32's is in oneDNN / MKL)."""
    p = policy(dtype)
    if M > p["masked_max_m"][kind]:
        return "dense"
    lo = p.get("masked_full_union_min_m", {}).get(kind)
    hi = p.get("masked_full_union_max_m", {}).get(kind, p["masked_max_m"][kind])
    if lo is not None and lo <= M <= hi:
        return "masked"
    return "masked" if union() < p["dense_union_min"] else "dense"


def _flat(x: torch.Tensor, mask: torch.Tensor):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    m2 = mask.reshape(-1, mask.shape[-1])
    return x2, (m2 if m2.dtype == torch.int32 else m2.to(torch.int32)).contiguous()


def _expand(mask2: torch.Tensor, group_size: int, dtype) -> torch.Tensor:
    return mask2.to(dtype).repeat_interleave(group_size, dim=-1)


def _zero_skipped_(y: torch.Tensor, mask2: torch.Tensor) -> torch.Tensor:
    """y [M, G * gs] with the channels of skipped groups set to 0, in place (no [M, N] mask is built)."""
    M, G = mask2.shape
    y.view(M, G, -1).mul_(mask2.to(y.dtype).unsqueeze(-1))
    return y


@functools.lru_cache(maxsize=64)
def _ones(M: int) -> torch.Tensor:
    """The int32 [M, 1] mask of one group every token executes (kept: the ops only read it)."""
    return torch.ones(M, 1, dtype=torch.int32)


def dense_linear(x, w, bias=None) -> torch.Tensor:
    """x W^T + b for a projection without groups (k, v, the LM head): a masked projection whose one group every
    token executes, so the kernel serves it where policy.json says the masked kernel beats the dense GEMM at a
    full union for this many tokens (q_proj's measured run, masked_full_union_min_m .. _max_m: torch's CPU GEMV
    on bfloat16 / float16 weights reads them well below the memory's bandwidth), else F.linear."""
    x2 = x.reshape(-1, x.shape[-1])
    M, N = x2.shape[0], w.shape[0]
    if x2.dtype not in _DTYPES or w.dtype != x2.dtype or not available() or x.device.type != "cpu" \
            or choose("n", M, str(x2.dtype)[6:], lambda: 1.0) != "masked":
        return F.linear(x, w, bias)
    PATHS["linear", "masked"] += 1
    y = x2.new_empty(M, N)
    run_op("gemm_n", x2.contiguous(), w.contiguous(), _ones(M), N, bias, y)
    return y.reshape(*x.shape[:-1], N)


def masked_gemm_n(x, w, mask, group_size: int, bias=None, out=None, path: str | None = None):
    """(x W^T + b) with the outputs of skipped groups exactly 0; x [.., K], w [N, K], mask [.., N/group_size]."""
    x2, m2 = _flat(x, mask)
    if _masked("n", x2, w, m2, path):
        PATHS["n", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], w.shape[0])
        run_op("gemm_n", x2, w.contiguous(), m2, group_size, bias, y)
    else:
        PATHS["n", "dense"] += 1
        y = _zero_skipped_(F.linear(x2, w, bias), m2)
    return y.reshape(*x.shape[:-1], w.shape[0])


def masked_gated_mlp(x, w_gate, w_up, mask, group_size: int, out=None, path: str | None = None):
    """silu(x Wg^T) * (x Wu^T) with the channels of skipped groups exactly 0."""
    x2, m2 = _flat(x, mask)
    if _masked("gated", x2, w_gate, m2, path):
        PATHS["gated", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], w_gate.shape[0])
        run_op("gated", x2, w_gate.contiguous(), w_up.contiguous(), m2, group_size, y)
    else:
        PATHS["gated", "dense"] += 1
        y = F.silu(F.linear(x2, w_gate), inplace=True).mul_(F.linear(x2, w_up))
        _zero_skipped_(y, m2)
    return y.reshape(*x.shape[:-1], w_gate.shape[0])


PACK_KB = 16  # output channels per packed block (csrc/common.h: KB)


def pack_k(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """A K-pruned weight [N, K] in the layout the CPU kernel streams: [G, N / 16, group_size, 16], channel
    n = 16 c + j of input k of group g at [g, c, k, j]. A decode step then reads each executed group's weights
    as one contiguous run per thread; in [N, K] a skipped group is a gap in every row, which the CPU's
    prefetchers read much of anyway. masked_gemm_k takes either layout (same results). N a multiple of 16
    (every model's hidden size is)."""
    N, K = w.shape
    if K % group_size or N % PACK_KB:
        raise ValueError(f"pack_k needs K = {K} a multiple of the group size {group_size} and N = {N} one of "
                         f"{PACK_KB}")
    return w.view(N // PACK_KB, PACK_KB, K // group_size, group_size).permute(2, 0, 3, 1).contiguous()


def unpack_k(wp: torch.Tensor) -> torch.Tensor:
    """The [N, K] weight of a pack_k one (a copy)."""
    G, C, gs, kb = wp.shape
    return wp.permute(1, 3, 0, 2).reshape(C * kb, G * gs)


def masked_gemm_k(x, w, mask, group_size: int, bias=None, out=None, path: str | None = None, packed=None):
    """x W^T + b over the input groups each token executes (skipped input columns ignored). w [N, K]; `packed`
    (pack_k of w), when the caller keeps it, is what the masked kernel reads. w may be packed itself: the dense
    path then runs one GEMM per executed group on that group's slice (_dense_packed). A w that is the transposed
    view of a contiguous W^T [K, N] (w = wt.t()) goes to masked_gemm_kt."""
    if packed is None and w.dim() == 2 and not w.is_contiguous() and w.t().is_contiguous():
        return masked_gemm_kt(x, w.t(), mask, group_size, bias, out, path)  # W^T's storage (CpuKernelsMethod)
    x2, m2 = _flat(x, mask)
    N = w.shape[0] if w.dim() == 2 else w.shape[1] * PACK_KB
    kernel_w = packed if packed is not None else w
    if _masked("k", x2, kernel_w, m2, path):
        PATHS["k", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], N)
        run_op("gemm_k", x2, kernel_w.contiguous(), m2, group_size, bias, y)
    elif w.dim() == 2:
        PATHS["k", "dense"] += 1
        y = F.linear(_zero_skipped_(x2.clone(), m2), w, bias)
    else:
        PATHS["k", "dense"] += 1
        y = _dense_packed(_zero_skipped_(x2.clone(), m2), w, m2, bias)
    return y.reshape(*x.shape[:-1], N)


SLAB_BYTES = 8 << 20  # _dense_packed's weight slab: a few groups' [gs, N] slices, made while they are in cache


def _dense_packed(xz: torch.Tensor, wp: torch.Tensor, m2: torch.Tensor, bias) -> torch.Tensor:
    """x W^T from a packed weight alone ([G, N/16, gs, 16]; xz with skipped groups' columns already 0): the
    groups some token executes, a slab of them at a time laid out as [groups * gs, N] (a copy that stays in
    cache), one GEMM per slab, summed. No copy of the whole weight is made (the vLLM plugin keeps no [N, K])."""
    G, C, gs, kb = wp.shape
    M, N = xz.shape[0], C * kb
    y = xz.new_zeros(M, N) if bias is None else bias.to(xz.dtype).expand(M, N).clone()
    xg = xz.view(M, G, gs)
    per = max(1, SLAB_BYTES // (gs * N * xz.element_size()))
    slab = xz.new_empty(per * gs, N)
    groups = m2.any(0).nonzero().flatten()
    for start in range(0, len(groups), per):
        chunk = groups[start:start + per]
        n = len(chunk)
        slab[:n * gs].view(n, gs, C, kb).copy_(wp[chunk].transpose(1, 2))
        y.addmm_(xg[:, chunk].reshape(M, n * gs), slab[:n * gs])
    return y


def masked_gemm_kt(x, wt, mask, group_size: int, bias=None, out=None, path: str | None = None):
    """x W^T + b over the input groups each token executes, from wt = W^T [K, N] contiguous (w.t().contiguous()):
    each group's weights one contiguous block for the masked kernel, and the dense GEMM's operand as it is
    (F.linear(x, wt.t())), so one copy serves decode and prefill. The policy is gemm_k's."""
    x2, m2 = _flat(x, mask)
    N = wt.shape[1]
    if _masked("k", x2, wt, m2, path):
        PATHS["kt", "masked"] += 1
        y = out if out is not None else x2.new_empty(x2.shape[0], N)
        run_op("gemm_kt", x2, wt.contiguous(), m2, group_size, bias, y)
    else:
        PATHS["kt", "dense"] += 1
        y = F.linear(_zero_skipped_(x2.clone(), m2), wt.t(), bias)
    return y.reshape(*x.shape[:-1], N)


ROUTER_MAX_M = 16  # tokens up to which the fused router serves a call; more (a prefill): torch's float32 GEMM


def _fusable(x: torch.Tensor, *same: torch.Tensor) -> bool:
    return (x.dtype in _DTYPES and x.is_contiguous() and x.device.type == "cpu" and available()
            and all(t.dtype == x.dtype and t.is_contiguous() for t in same))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
    """The model's RMSNorm (w * (x * rsqrt(mean(x^2) + eps)) rounded as the reference rounds) in one call, or
    None where the fused op cannot serve (kernels not built, w of another dtype, x not contiguous): the caller
    then runs its reference."""
    if not _fusable(x, w):
        return None
    out = torch.empty_like(x)
    return out if run_op("rms_norm", x, w, eps, out) else None


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotary embedding of q [B, T, Hq, D] and k [B, T, Hk, D] in place (x * cos + rotate_half(x) * sin, rounded
    as the reference), cos / sin [B, 1, T, D] of their dtype; False (nothing changed) where the fused op cannot
    serve."""
    if not (_fusable(q, k, cos, sin) and cos.shape[1] == 1 and cos.shape == sin.shape):
        return False
    c, s = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
    return run_op("rope", q, c, s) and run_op("rope", k, c, s)  # both or (float16 on the
    # scalar path) neither


def decode_attention(q, k, v, head_mask=None, group_heads: int = 1):
    """Attention of one query per sequence, q [B, Hq, 1, D], over all of k / v [B, Hk, L, D] (GQA; a view of a
    preallocated cache is read in place), softmax(q k^T / sqrt(D)) v as [B, Hq, 1, D]; with head_mask
    [B, .., Hq / group_heads] the heads of skipped groups are not computed (their outputs are 0, which o_proj
    ignores) and a KV head none of whose query heads is active is not read. None where the op declines (neither
    AVX-512 nor AVX2 with D a multiple of 8, other dtypes or layouts): the caller runs torch's attention."""
    B, Hq, T, D = q.shape
    if T != 1 or not _fusable(q) or k.dtype != q.dtype or v.dtype != q.dtype or k.stride(-1) != 1 \
            or v.stride(-1) != 1 or k.stride(-2) != D or v.stride(-2) != D:
        return None
    q3 = q.reshape(B, Hq, D)
    m = None if head_mask is None else head_mask.reshape(B, -1).to(torch.int32).contiguous()
    out = torch.empty_like(q3)
    ok = run_op("decode_attention", q3, k, v, k.shape[2], m, group_heads, out)
    return out.view(B, Hq, 1, D) if ok else None


def router(hidden, wc, bc, wr, br):
    """The router's int32 mask [.., G]: for up to ROUTER_MAX_M tokens the fused op (two float32 GEMVs through
    the kernels and the execute rule in one call), else the reference's torch ops (a prefill's GEMMs)."""
    from wide_export.ops.reference import wide_router

    if hidden.numel() <= ROUTER_MAX_M * hidden.shape[-1] and _fusable(hidden) \
            and all(t.dtype == torch.float32 and t.is_contiguous() for t in (wc, bc, wr, br)):
        mask = torch.empty(*hidden.shape[:-1], wr.shape[0] // 2, dtype=torch.int32)
        run_op("router", hidden, wc, bc, wr, br, mask)
        return mask
    return wide_router(hidden, wc, bc, wr, br)
