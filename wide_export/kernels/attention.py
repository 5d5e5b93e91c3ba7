"""Decode attention that leaves out the heads of skipped attention groups, on torch tensors (the kernels:
triton_kernels.py, wide_decode_attention_kernel + wide_attention_reduce_kernel; CUDA tensors JIT, CPU tensors in
Triton's interpreter). The reference: wide_export.ops.reference.masked_attention.

    out = decode_attention(q, k_cache, v_cache, head_mask, group_heads, lengths)

q [B, Hq, D] (one query per sequence), k / v [B, Hk, capacity, D] with head_dim contiguous (a preallocated
cache read in place), lengths int32 [B] (each sequence's past, default the capacity), head_mask int [B, G]
(G = Hq / group_heads; None: every head). Outputs of skipped heads are exactly 0; a KV head none of whose
query heads is active is not read. Long contexts split over the sequence (`splits`, chosen from the length
and the GPU's size unless given), partials combined in a fixed order."""

from __future__ import annotations

from typing import Optional

from wide_export.base.errors import WideError

BLOCK_L = 64  # keys per tile
SPLIT_TARGET_PROGRAMS = 264  # programs a decode call aims at (two waves of an H100's 132 SMs)
MAX_SPLITS = 64  # the reduction's BLOCK_S in the plugin's cubins (configs.ATTENTION_MAX_SPLITS)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check_layout(op: str, q, k, v, cache: str) -> None:
    """What both kernels address by hand: head_dim contiguous in q, k and v, and the cache's rows D apart."""
    D = q.shape[-1]
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k.stride(-2) != D or v.stride(-2) != D or q.stride(-1) != 1:
        raise WideError(f"{op} needs head_dim contiguous and cache rows D apart",
                        f"pass k / v as {cache} views of a contiguous cache")


def plan_splits(batch: int, kv_heads: int, length: int, block_l: int = BLOCK_L,
                target: int = SPLIT_TARGET_PROGRAMS) -> tuple[int, int]:
    """(splits, tiles per split) for a call: enough (sequence, KV head, split) programs to fill the GPU, each
    split at least one tile of keys."""
    tiles = max(1, -(-length // block_l))
    splits = max(1, min(tiles, target // max(1, batch * kv_heads), MAX_SPLITS))
    per = -(-tiles // splits)
    return -(-tiles // per), per


def _splits(batch: int, kv_heads: int, length: int, splits: Optional[int], block_l: int) -> tuple[int, int]:
    """(splits, tiles per split): plan_splits's, or `splits` asked for (fewer where the tiles run out)."""
    if splits is None:
        return plan_splits(batch, kv_heads, length, block_l)
    tiles = max(1, -(-length // block_l))
    per = -(-tiles // splits)
    return -(-tiles // per), per


def decode_attention(q, k, v, head_mask=None, group_heads: int = 1, lengths=None, *, splits: Optional[int] = None,
                     block_l: int = BLOCK_L):
    import torch

    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape:
        raise WideError("decode_attention takes q [B, Hq, D] and k / v [B, Hk, L, D] of one shape",
                        f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    B, Hq, D = q.shape
    Hk, cap = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or Hq % Hk:
        raise WideError(f"q {list(q.shape)} and k {list(k.shape)} do not match (batch, head size, Hq % Hk == 0)",
                        "pass q [B, Hq, D] and the cache [B, Hk, L, D]")
    _check_layout("decode_attention", q, k, v, "[B, Hk, L, D]")
    G = Hq // group_heads if head_mask is not None else 1
    if head_mask is not None and (Hq % group_heads or head_mask.numel() != B * G):
        raise WideError(f"head_mask must be [B, {Hq} / group_heads] (group_heads {group_heads})",
                        "pass the attention router's mask of this step")
    lens = torch.full((B,), cap, dtype=torch.int32, device=q.device) if lengths is None \
        else lengths.to(device=q.device, dtype=torch.int32).contiguous()
    mask = None if head_mask is None else head_mask.reshape(B, G).to(torch.int32).contiguous()
    L = int(lens.max()) if lengths is not None else cap
    splits, per = _splits(B, Hk, L, splits, block_l)
    out = torch.empty((B, Hq, D), dtype=q.dtype, device=q.device)
    _decode(q, k, v, lens, None, mask, out, splits, per, block_l, G)
    return out


def _decode(q, k, v, lens, allowed, mask, out, splits: int, per: int, block_l: int, G: int) -> None:
    """The decode kernel (+ the reduction over splits) on q [B, Hq, D]-strided rows, out [B, Hq, D] contiguous;
    `allowed` [B, S] bytes (WideMaskedAttention: every sequence S keys) or per-sequence `lens`."""
    import torch

    from wide_export.kernels.launch import _precise, kernels

    src = kernels()
    B, Hq, D = out.shape
    Hk, S = k.shape[1], k.shape[2]
    rep = Hq // Hk
    f32 = torch.float32
    pacc = torch.empty((splits, B, Hq, D), dtype=f32, device=q.device) if splits > 1 else out
    pm = torch.empty((splits, B, Hq), dtype=f32, device=q.device) if splits > 1 else out
    pl = torch.empty_like(pm) if splits > 1 else out
    src.wide_decode_attention_kernel[(B, Hk, splits)](
        q, k, v, lens if lens is not None else out, allowed if allowed is not None else out,
        mask if mask is not None else out, out, pacc, pm, pl,
        Hq, G, D, rep, S, 0 if allowed is None else allowed.stride(0), q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), D**-0.5, per,
        BLOCK_H=max(16, _pow2(rep)), BLOCK_L=block_l, BLOCK_D=max(16, _pow2(D)),
        HAS_MASK=mask is not None, HAS_ALLOWED=allowed is not None, PARTIAL=splits > 1, PRECISE=_precise(q.dtype),
        num_warps=4)
    if splits > 1:
        src.wide_attention_reduce_kernel[(B * Hq,)](pacc, pm, pl, out, splits, B * Hq, D,
                                                   BLOCK_S=max(2, _pow2(splits)), BLOCK_D=max(16, _pow2(D)),
                                                   num_warps=4)


BLOCK_M = 64  # queries per prefill tile
BLOCK_N = 64  # keys per prefill step


def prefill_attention(q, k, v, head_mask=None, group_heads: int = 1, past_len: Optional[int] = None, *,
                      block_m: int = BLOCK_M, block_n: int = BLOCK_N):
    """Causal attention of T new tokens per sequence, q [B, T, Hq, D] (the q projection's layout, head_dim
    contiguous), over k / v [B, Hk, S, D] (S = past_len + T keys, the new ones included; default past S - T);
    head_mask int [B, T, G]: a (token, head) whose group is skipped is 0, and a tile of block_m tokens none of
    which keeps a head's group does not compute that head. Returns [B, T, Hq, D] contiguous."""
    import torch

    from wide_export.kernels.launch import _precise, kernels

    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise WideError("prefill_attention takes q [B, T, Hq, D] and k / v [B, Hk, S, D] of one shape",
                        f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    B, T, Hq, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    past = S - T if past_len is None else int(past_len)
    if k.shape[0] != B or k.shape[3] != D or Hq % Hk or not 0 <= past <= S - T:
        raise WideError(f"q {list(q.shape)} and k {list(k.shape)} do not match (batch, head size, Hq % Hk == 0, "
                        f"past {past} + T {T} <= S {S})", "pass q [B, T, Hq, D] and the cache [B, Hk, S, D]")
    _check_layout("prefill_attention", q, k, v, "[B, Hk, S, D]")
    G = Hq // group_heads if head_mask is not None else 1
    if head_mask is not None and (Hq % group_heads or head_mask.numel() != B * T * G):
        raise WideError(f"head_mask must be [B, T, {Hq} / group_heads] (group_heads {group_heads})",
                        "pass the attention router's mask of these tokens")
    mask = None if head_mask is None else head_mask.reshape(B, T, G).to(torch.int32).contiguous()
    out = torch.empty((B, T, Hq, D), dtype=q.dtype, device=q.device)
    kernels().wide_masked_attention_kernel[(-(-T // block_m), B * Hq)](
        q, k, v, out, mask if mask is not None else out, out, T, S, past, Hq, G, D, Hq // Hk,
        q.stride(0), q.stride(2), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), 0, 0,
        out.stride(0), out.stride(2), out.stride(1), D**-0.5,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, _pow2(D)), HAS_MASK=mask is not None, HAS_ALLOWED=False,
        CAUSAL=True, PRECISE=_precise(q.dtype), num_warps=4)
    return out


def masked_attention_op(q, k, v, allowed, head_mask, group_heads: int, *, causal: bool = True,
                        block_m: int = BLOCK_M, block_n: int = BLOCK_N, splits: Optional[int] = None):
    """WideMaskedAttention as the ONNX op and its TensorRT plugin state it (reference.wide_masked_attention):
    q [B, Hq, T, D], k / v [B, Hk, S, D] (past and new keys), allowed bool [B, 1, T, S], head_mask int
    [B, T, Hq / group_heads] or None; returns [B, Hq, T, D]. A key not allowed is scored float32's lowest
    value, so a row allowed no key gets the mean of v over all S keys, as the model's attention gives it.
    causal (the op's contract: allowed is false after each query's position S - T + t): those keys are
    not scored at all. One query (T = 1, decode) runs the decode kernel, split over the keys (`splits`, planned
    from the sizes unless given); more run the tile kernel."""
    import torch

    from wide_export.kernels.launch import _precise, kernels

    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or allowed.dim() != 4:
        raise WideError("masked_attention_op takes q [B, Hq, T, D], k / v [B, Hk, S, D] and allowed [B, 1, T, S]",
                        f"got q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}, allowed {list(allowed.shape)}")
    B, Hq, T, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != D or Hq % Hk or S < T or tuple(allowed.shape) != (B, 1, T, S):
        raise WideError(f"q {list(q.shape)}, k {list(k.shape)} and allowed {list(allowed.shape)} do not match "
                        "(batch, head size, Hq % Hk == 0, S >= T, allowed [B, 1, T, S])",
                        "pass the layer's q, its present keys and values, and the model's allowed mask")
    _check_layout("masked_attention_op", q, k, v, "[B, Hk, S, D]")
    G = Hq // group_heads if head_mask is not None else 1
    if head_mask is not None and (Hq % group_heads or head_mask.numel() != B * T * G):
        raise WideError(f"head_mask must be [B, T, {Hq} / group_heads] (group_heads {group_heads})",
                        "pass the attention router's mask of these tokens")
    mask = None if head_mask is None else head_mask.reshape(B, T, G).to(torch.int32).contiguous()
    ok = allowed.to(torch.bool)
    ok = (ok if ok.stride(-1) == 1 else ok.contiguous()).view(torch.uint8)
    out = torch.empty((B, Hq, T, D), dtype=q.dtype, device=q.device)
    if T == 1:
        splits, per = _splits(B, Hk, S, splits, BLOCK_L)
        _decode(q[:, :, 0], k, v, None, ok[:, 0, 0], None if mask is None else mask.reshape(B, G), out.view(B, Hq, D),
                splits, per, BLOCK_L, G)
        return out
    kernels().wide_masked_attention_kernel[(-(-T // block_m), B * Hq)](
        q, k, v, ok, mask if mask is not None else out, out, T, S, S - T, Hq, G, D, Hq // Hk,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        ok.stride(0), ok.stride(2), out.stride(0), out.stride(1), out.stride(2), D**-0.5,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, _pow2(D)), HAS_MASK=mask is not None, HAS_ALLOWED=True,
        CAUSAL=causal, PRECISE=_precise(q.dtype), num_warps=4)
    return out
