"""The decoder-layer stack `bench e2e` times: one set of random weights, run dense or WIDE.

A Llama layer reduced to what costs time: RMSNorm and RoPE (the reference
decoder's own, model/modeling.py), q/k/v/o, causal attention, SiLU-gated MLP.
The dense side is the dense model as a serving engine would run it: fused
[q; k; v] and [gate; up] weights through cuBLAS (F.linear), PyTorch's SDPA over
every head. The WIDE side routes every sublayer and runs `wide_export.kernels`:
masked q (gemm_n), dense [k; v], attention that skips the heads of skipped
groups (kernels/attention.py; on CPU the compiled decode attention, SDPA for
prefill), masked o (gemm_k), masked gate+up (gated), masked down (gemm_k).
Router biases are calibrated so that each group executes for a fraction
1 - sparsity of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

from wide_export.model.modeling import apply_rope, rms_norm

EPS = 1e-5  # RMSNorm's epsilon


@dataclass(frozen=True)
class StackShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    heads_per_group: int      # query heads per attention group
    ffn_group_size: int       # FFN channels per group
    router_rank: int
    model_layers: int         # layers of the full model: per-layer figures scale to it

    @property
    def attn_group_size(self) -> int:
        """q output channels (= o input channels) per attention group."""
        return self.heads_per_group * self.head_dim


# Llama-3.1-8B (recipes/llama-3.1-8b.json: 4 heads = one GQA group per attention group, 128 FFN channels).
LLAMA_8B = StackShape("llama-3.1-8b", 4096, 32, 8, 128, 14336, 4, 128, 64, 32)
TINY = StackShape("tiny", 64, 8, 2, 8, 128, 2, 16, 16, 2)


@dataclass
class Layer:
    ln1: Any
    ln2: Any
    wq: Any
    wkv: Any
    wo: Any
    wg: Any
    wu: Any
    wd: Any
    wqkv: Any                 # dense side: [wq; wkv]
    wgu: Any                  # dense side: [wg; wu]
    router_attn: list = field(default_factory=list)   # [wc, bc, wr, br] float32
    router_ffn: list = field(default_factory=list)
    wo_k: Any = None          # WIDE side on CPU: wo / wd packed per input group (wide_export.cpu.pack_k)
    wd_k: Any = None


def random_stack(shape: StackShape, layers: int, dtype, device, generator) -> list[Layer]:
    """Random weights, std 1/sqrt(fan_in) (activations stay O(1)); routers float32 with zero router bias."""
    import torch

    def w(n, k, dt=dtype):
        return (torch.randn(n, k, generator=generator, device=device) / k**0.5).to(dt)

    def router(groups):
        R = shape.router_rank
        return [w(R, shape.hidden, torch.float32), 0.1 * torch.randn(R, generator=generator, device=device),
                w(2 * groups, R, torch.float32), torch.zeros(2 * groups, device=device)]

    q, kv, H, I = shape.heads * shape.head_dim, 2 * shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    out = []
    for _ in range(layers):
        norm = lambda: (1 + 0.1 * torch.randn(H, generator=generator, device=device)).to(dtype)  # noqa: E731
        wq, wkv, wg, wu = w(q, H), w(kv, H), w(I, H), w(I, H)
        out.append(Layer(norm(), norm(), wq, wkv, w(H, q), wg, wu, w(H, I), torch.cat([wq, wkv]),
                         torch.cat([wg, wu]), router(shape.heads // shape.heads_per_group),
                         router(I // shape.ffn_group_size)))
    return out


def rope(positions, head_dim: int, dtype, theta: float = 500000.0):
    """(cos, sin) [T, D] of the plain (non-scaled) rotary embedding."""
    import torch

    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    f = positions.float()[:, None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _sdpa(q, k, v, causal: bool):
    """PyTorch SDPA on [B, heads, T, D]; GQA through enable_gqa (repeat_interleave on older torch)."""
    import torch.nn.functional as F

    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              is_causal=causal)


def _attention(shape: StackShape, q, kv, rotary, cache, attend=None, mask=None):
    """q [B, T, Hq*D], kv [B, T, 2*Hkv*D] -> o [B, T, Hq*D]. cache: None (prefill) or (k, v, pos) static tensors.
    attend: the WIDE side's attention that skips the heads of groups `mask` [B, T, G] skips (None: SDPA)."""
    B, T, _ = q.shape
    D = shape.head_dim
    cos, sin = rotary
    q = apply_rope(q.view(B, T, shape.heads, D).transpose(1, 2), cos, sin)
    k, v = kv.view(B, T, 2, shape.kv_heads, D).permute(2, 0, 3, 1, 4)
    k = apply_rope(k, cos, sin)
    if cache is not None:  # decode: write this step's k/v at `pos`, attend to the whole cache
        kc, vc, pos = cache
        kc[:, :, pos:pos + T].copy_(k)
        vc[:, :, pos:pos + T].copy_(v)
        k, v = kc[:, :, :pos + T], vc[:, :, :pos + T]
    o = None if attend is None else attend(q, k, v, mask, shape.heads_per_group, cache is not None)
    if o is None:
        o = _sdpa(q, k, v, causal=cache is None)
    return o.transpose(1, 2).reshape(B, T, shape.heads * D)


def _triton_attention(q, k, v, mask, group_heads: int, decode: bool):
    """WIDE's attention kernels (kernels/attention.py) on q [B, Hq, T, D] and k / v [B, Hkv, S, D]: decode over
    the cache (one query a sequence), else causal prefill; [B, Hq, T, D]."""
    from wide_export.kernels.attention import decode_attention, prefill_attention

    B, Hq, T, D = q.shape
    if decode and T == 1:
        return decode_attention(q[:, :, 0], k, v, mask.reshape(B, -1), group_heads)[:, :, None]
    return prefill_attention(q.transpose(1, 2), k.contiguous(), v.contiguous(), mask, group_heads).transpose(1, 2)


def _cpu_attention(q, k, v, mask, group_heads: int, decode: bool):
    """wide_export.cpu's decode attention (None where it declines, e.g. a prefill: SDPA then)."""
    from wide_export import cpu

    return cpu.decode_attention(q, k, v, mask, group_heads) if decode else None


def dense_layer(shape: StackShape, L: Layer, h, rotary, cache=None):
    """The dense model's layer: fused cuBLAS GEMMs (F.linear)."""
    import torch.nn.functional as F

    qd = shape.heads * shape.head_dim
    qkv = F.linear(rms_norm(h, L.ln1, EPS), L.wqkv)
    h = h + F.linear(_attention(shape, qkv[..., :qd], qkv[..., qd:], rotary, cache), L.wo)
    g, u = F.linear(rms_norm(h, L.ln2, EPS), L.wgu).chunk(2, dim=-1)
    return h + F.linear(F.silu(g) * u, L.wd)


def kernel_ops(algo: str = "auto") -> SimpleNamespace:
    """The WIDE side's ops: `wide_export.kernels` (Triton)."""
    import functools

    from wide_export import kernels

    return SimpleNamespace(algo=algo, router=kernels.router,
                           gemm_n=functools.partial(kernels.masked_gemm_n, algo=algo),
                           gated=functools.partial(kernels.masked_gated_mlp, algo=algo),
                           gemm_k=functools.partial(kernels.masked_gemm_k, algo=algo), attention=_triton_attention)


def pack_for_cpu(shape: StackShape, layers: list[Layer]) -> None:
    """Give the WIDE side's CPU kernels its K-pruned weights in wide_export.cpu's packed layout too (a second
    copy of wo and wd: the masked kernel reads the packed one, a dense fallback (prefill) [N, K])."""
    from wide_export import cpu

    for L in layers:
        L.wo_k = cpu.pack_k(L.wo, shape.attn_group_size)
        L.wd_k = cpu.pack_k(L.wd, shape.ffn_group_size)


def cpu_ops() -> SimpleNamespace:
    """The WIDE side's ops on CPU: `wide_export.cpu` (compiled kernels or dense + mask, by its policy)."""
    from wide_export import cpu

    return SimpleNamespace(algo="cpu", router=cpu.router, gemm_n=cpu.masked_gemm_n, gated=cpu.masked_gated_mlp,
                           gemm_k=cpu.masked_gemm_k, attention=_cpu_attention)


def reference_ops() -> SimpleNamespace:
    """The same ops from the PyTorch oracles (wide_export.ops.reference), for the correctness check."""
    from wide_export.ops import reference as ref

    return SimpleNamespace(router=ref.wide_router, gemm_n=ref.masked_gemm_n, gated=ref.masked_gated_mlp,
                           gemm_k=ref.masked_gemm_k)


def _wide_attention(shape: StackShape, L: Layer, h, rotary, ops, cache=None):
    ma = ops.router(h, *L.router_attn)
    x = rms_norm(h, L.ln1, EPS)
    q = ops.gemm_n(x, L.wq, ma, shape.attn_group_size)
    o = _attention(shape, q, _linear(x, L.wkv), rotary, cache, getattr(ops, "attention", None), ma)
    return h + _gemm_k(ops, o, L.wo, L.wo_k, ma, shape.attn_group_size), ma


def _wide_ffn(shape: StackShape, L: Layer, h, ops):
    mf = ops.router(h, *L.router_ffn)
    y = ops.gated(rms_norm(h, L.ln2, EPS), L.wg, L.wu, mf, shape.ffn_group_size)
    return h + _gemm_k(ops, y, L.wd, L.wd_k, mf, shape.ffn_group_size), mf


def _gemm_k(ops, x, w, packed, mask, group_size: int):
    """The K-pruned projection; the CPU ops get the packed copy for their kernel (their dense path keeps w)."""
    if packed is not None and getattr(ops, "algo", None) == "cpu":
        return ops.gemm_k(x, w, mask, group_size, packed=packed)
    return ops.gemm_k(x, w, mask, group_size)


def _linear(x, w):
    import torch.nn.functional as F

    return F.linear(x, w)


def wide_layer(shape: StackShape, L: Layer, h, rotary, ops, cache=None, masks: Optional[list] = None):
    """The WIDE layer through `ops`; appends (attention mask, ffn mask) to `masks` when given."""
    h, ma = _wide_attention(shape, L, h, rotary, ops, cache)
    h, mf = _wide_ffn(shape, L, h, ops)
    if masks is not None:
        masks.append((ma, mf))
    return h


def set_sparsity(router: list, h, sparsity: float) -> None:
    """Bias the execute logits so each group skips a fraction `sparsity` of the tokens in h.

    Group g executes iff margin_g = l[g, 0] - l[g, 1] >= 0; adding -quantile(margin_g, sparsity)
    to the execute logit's bias puts that quantile at 0.
    """
    import torch

    from wide_export.ops.reference import router_logits

    router[3].zero_()
    logits = router_logits(h.reshape(-1, h.shape[-1]), *router)  # [T, G, 2]
    margin = logits[..., 0] - logits[..., 1]
    q = torch.tensor(min(max(sparsity, 0.0), 1.0), dtype=torch.float32, device=h.device)
    shift = -torch.quantile(margin, q, dim=0)
    if sparsity <= 0:
        shift = shift + 1e4  # every group executes
    elif sparsity >= 1:
        shift = shift - 1e4  # none does
    router[3][0::2] = shift


def calibrate(shape: StackShape, layers: list[Layer], h, sparsity: float) -> None:
    """Set every router's bias (set_sparsity) on the calibration tokens h [1, T, H], layer by layer,
    on the hidden states the already-calibrated WIDE stack produces (PyTorch reference ops)."""
    import torch

    ops = reference_ops()
    rotary = rope(torch.arange(h.shape[1], device=h.device), shape.head_dim, h.dtype)
    for L in layers:
        set_sparsity(L.router_attn, h, sparsity)
        h, _ = _wide_attention(shape, L, h, rotary, ops)
        set_sparsity(L.router_ffn, h, sparsity)
        h, _ = _wide_ffn(shape, L, h, ops)
