"""The `wide` ops' GPU kernels on torch tensors (OpenAI Triton; sources in ``triton_kernels.py``).

    from wide_export import kernels
    mask = kernels.router(h, wc, bc, wr, br)                  # int32 [..., G]
    q    = kernels.masked_gemm_n(x, wq, mask, group_size, bias=None)
    y    = kernels.masked_gated_mlp(x, w_gate, w_up, mask, group_size)
    o    = kernels.masked_gemm_k(y, w_down, mask, group_size)

Weights are in nn.Linear layout [N, K]. CUDA tensors run the compiled kernels;
CPU tensors run the very same kernels in Triton's interpreter (slow, for
tests). ``algo=`` picks an algorithm ("auto", "gemv", "grouped", "tile",
"dense"); "auto" follows the per-architecture table in ``policy.json``.
The PyTorch oracles are ``wide_export.ops.reference``.
"""

from __future__ import annotations

__all__ = ["router", "masked_gemm_n", "masked_gated_mlp", "masked_gemm_k"]


def __getattr__(name: str):
    if name in __all__:
        from wide_export.kernels import launch

        return getattr(launch, name)
    raise AttributeError(f"module 'wide_export.kernels' has no attribute {name!r}")
