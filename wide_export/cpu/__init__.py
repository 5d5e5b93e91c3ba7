"""CPU kernels of the `wide` masked projections (C++ with AVX-512 / AVX2, torch custom ops `wide_cpu::*`).

    from wide_export import cpu
    y = cpu.masked_gemm_n(x, w, mask, group_size, bias=None)   # q_proj: skipped head groups' columns unread
    y = cpu.masked_gated_mlp(x, w_gate, w_up, mask, group_size) # gate/up + SiLU-and-mul, skipped channels unread
    y = cpu.masked_gemm_k(x, w, mask, group_size, bias=None)   # o_proj / down_proj: skipped input columns unread
    wp = cpu.pack_k(w, group_size)                              # [G, N/16, gs, 16]: streamed at decode
    y = cpu.masked_gemm_k(x, w, mask, group_size, packed=wp)   # the kernel reads wp, a dense fallback w
    y = cpu.masked_gemm_kt(x, w.t().contiguous(), mask, group_size)  # W^T [K, N]: one copy, masked and dense
    y = cpu.dense_linear(x, w, bias)                            # k / v / LM head: the kernel where it beats torch
    y = cpu.rms_norm(x, w, eps); cpu.rope_(q, k, cos, sin)      # the decode step's small ops, one call each
    mask = cpu.router(h, wc, bc, wr, br)                        # (None / False where the fused op declines)
    o = cpu.decode_attention(q, k, v, head_mask, group_heads)   # one query a sequence, skipped heads left out

The library is compiled on first use against the installed torch's headers (``build.py``; cached per source,
torch and compiler), so nothing is downloaded. Which of the masked kernel and the dense GEMM (+ mask) serves
a call is data (``policy.json``, measured by ``wide-export bench kernels --device cpu``). The PyTorch oracles
are ``wide_export.ops.reference``."""

from __future__ import annotations

__all__ = ["masked_gemm_n", "masked_gated_mlp", "masked_gemm_k", "masked_gemm_kt", "dense_linear", "pack_k", "unpack_k",
           "router", "rms_norm", "rope_", "decode_attention", "isa", "available"]


def __getattr__(name: str):
    if name in __all__:
        from wide_export.cpu import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'wide_export.cpu' has no attribute {name!r}")
