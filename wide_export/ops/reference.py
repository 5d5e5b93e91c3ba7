"""PyTorch reference of every `wide` op (docs/opset.md), registered by op name.

These are the oracle for the ONNX function bodies, the CUDA kernels and the
TensorRT plugins. Math is float32 whatever the input dtype; results are cast
back to the input dtype (the router returns an int32 mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expand_mask(mask: torch.Tensor, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """[.., G] int/bool mask -> [.., G*group_size] per-channel 0/1 of `dtype`."""
    return mask.to(dtype).repeat_interleave(group_size, dim=-1)


def router_logits(hidden: torch.Tensor, wc, bc, wr, br) -> torch.Tensor:
    """[.., H] -> [.., G, 2] router logits in float32."""
    z = F.linear(hidden.float(), wc.float(), bc.float())
    logits = F.linear(z, wr.float(), br.float())
    return logits.unflatten(-1, (-1, 2))


def wide_router(hidden: torch.Tensor, wc, bc, wr, br) -> torch.Tensor:
    """WideRouter: int32 mask [.., G], 1 where logit 0 >= logit 1 (ties execute)."""
    logits = router_logits(hidden, wc, bc, wr, br)
    return (logits[..., 0] >= logits[..., 1]).to(torch.int32)


def masked_gemm_n(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    """WideMaskedGemmN: (x W^T + b) with outputs of skipped groups set to exactly 0."""
    y = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    return (y * expand_mask(mask, group_size, torch.float32)).to(x.dtype)


def masked_gated_mlp(x, w_gate, w_up, mask, group_size: int) -> torch.Tensor:
    """WideMaskedGatedMlp: silu(x Wg^T) * (x Wu^T), skipped channels 0."""
    xf = x.float()
    y = F.silu(F.linear(xf, w_gate.float())) * F.linear(xf, w_up.float())
    return (y * expand_mask(mask, group_size, torch.float32)).to(x.dtype)


def masked_gemm_k(x, w, mask, group_size: int, bias=None) -> torch.Tensor:
    """WideMaskedGemmK: x with skipped input groups ignored, times W^T, plus the bias (always added:
    the outputs are not grouped, so all groups off gives the bias)."""
    xm = torch.where(expand_mask(mask, group_size, torch.bool), x.float(), 0.0)
    return F.linear(xm, w.float(), None if bias is None else bias.float()).to(x.dtype)


def masked_attention(q, k, v, head_mask=None, group_heads: int = 1, past_len: int | None = None):
    """Attention that leaves out skipped heads: q [B, Hq, T, D], k / v [B, Hk, S, D] (GQA: query head h reads
    KV head h // (Hq / Hk)), causal with the T queries at positions past_len .. past_len + T - 1 of the S keys
    (default S - T); softmax(q k^T / sqrt(D)) v in float32, cast to q's dtype. head_mask [B, T, G] (or [B, G]
    for T = 1) int: the output of a (token, head) whose group (head // group_heads) is skipped is exactly 0."""
    B, Hq, T, D = q.shape
    S = k.shape[2]
    rep = Hq // k.shape[1]
    past = S - T if past_len is None else past_len
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scores = torch.matmul(q.float(), kf.transpose(-1, -2)) * D**-0.5
    causal = torch.arange(S)[None, :] <= (past + torch.arange(T))[:, None]
    scores = scores.masked_fill(~causal, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), vf)
    if head_mask is not None:
        keep = head_mask.reshape(B, T, -1).bool().repeat_interleave(group_heads, dim=-1)  # [B, T, Hq]
        out = out * keep.transpose(1, 2)[..., None]
    return out.to(q.dtype)


def attention(q, k, v, allowed) -> torch.Tensor:
    """The model's attention (model/modeling.py Attention): q [B, Hq, T, D], k / v [B, Hk, S, D] (GQA: each KV
    head serves Hq / Hk consecutive query heads, as transformers' repeat_kv), allowed bool [B, 1, T, S] (causal
    and padding). Scores q k^T / sqrt(D) in q's dtype; where not allowed the float32 minimum (a finite floor:
    the rows of left-padding positions are fully masked and must stay finite, as transformers does); softmax
    in float32, cast to v's dtype; times v."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        b, h, s, d = k.shape
        k = k[:, :, None].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)
        v = v[:, :, None].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    scores = torch.where(allowed, scores.float(), torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The model's RMSNorm (model/modeling.py RMSNorm): normalise in float32, scale in the input dtype (as
    transformers)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The model's rotary embedding: x * cos + rotate_half(x) * sin (cos / sin broadcast over heads)."""
    return x * cos + rotate_half(x) * sin


def wide_masked_attention(q, k, v, allowed, head_mask, group_heads: int) -> torch.Tensor:
    """WideMaskedAttention: attention() with the output of each (token, head) whose group (head // group_heads)
    head_mask [B, T, Hq / group_heads] (int) skips exactly 0; o_proj's masked GEMM ignores those heads anyway."""
    out = attention(q, k, v, allowed)
    keep = head_mask.bool().repeat_interleave(group_heads, dim=-1).transpose(1, 2)[..., None]  # [B, Hq, T, 1]
    return out * keep.to(out.dtype)


REFERENCES = {
    "WideRouter": wide_router,
    "WideMaskedGemmN": masked_gemm_n,
    "WideMaskedGatedMlp": masked_gated_mlp,
    "WideMaskedGemmK": masked_gemm_k,
    "WideMaskedAttention": wide_masked_attention,
}
