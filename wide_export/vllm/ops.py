"""The WIDE kernels as torch custom ops, so vLLM's torch.compile and CUDA graphs capture them whole.

Each op runs our Triton kernels (wide_export.kernels.launch: JIT on CUDA, the
interpreter on CPU tensors) and has a fake implementation that only gives the
output's shape and dtype, which is all Dynamo needs to trace around it. The
kernels pick their algorithm from the tensor shapes and the device's policy on
the host and read no device value, so a decode step needs no device-to-host copy
(read from the code; not yet run on a GPU).

  wide_vllm::router(h, wc, bc, wr, br)              -> int32 mask [T, G]
  wide_vllm::masked_gated_mlp(x, wg, wu, mask, gs)  -> silu(x Wg^T) * (x Wu^T), skipped groups 0
  wide_vllm::masked_gemm_k(x, w, mask, gs)          -> x W^T with skipped input groups ignored (no bias)

and on CPU tensors, wide_export.cpu's compiled kernels (or, where its measured policy says so, the dense GEMM
with the mask applied: a choice made from the mask's values, which is why the whole call is one op):

  wide_vllm::cpu_gemm_n(x, w, mask, gs, bias)       -> x W^T + b, outputs of skipped groups 0 (q_proj)
  wide_vllm::cpu_gated(x, wg, wu, mask, gs)         -> silu(x Wg^T) * (x Wu^T), skipped groups 0
  wide_vllm::cpu_gemm_kt(x, wt, mask, gs)           -> x W^T, skipped input groups ignored; wt = W^T [K, N]

The PyTorch references of the same ops are wide_export.ops.reference; the
kernels are tested against them in tests/kernels.
"""

from __future__ import annotations

import torch

NAMESPACE = "wide_vllm"


@torch.library.custom_op(f"{NAMESPACE}::router", mutates_args=())
def router(h: torch.Tensor, wc: torch.Tensor, bc: torch.Tensor, wr: torch.Tensor, br: torch.Tensor) -> torch.Tensor:
    from wide_export.kernels import launch

    return launch.router(h, wc, bc, wr, br)


@router.register_fake
def _router_fake(h, wc, bc, wr, br):
    return h.new_empty((*h.shape[:-1], wr.shape[0] // 2), dtype=torch.int32)


@torch.library.custom_op(f"{NAMESPACE}::masked_gated_mlp", mutates_args=())
def masked_gated_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, mask: torch.Tensor,
                     group_size: int) -> torch.Tensor:
    from wide_export.kernels import launch

    return launch.masked_gated_mlp(x, w_gate, w_up, mask, group_size)


@masked_gated_mlp.register_fake
def _gated_fake(x, w_gate, w_up, mask, group_size):
    return x.new_empty((*x.shape[:-1], w_gate.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::masked_gemm_k", mutates_args=())
def masked_gemm_k(x: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    from wide_export.kernels import launch

    return launch.masked_gemm_k(x, w, mask, group_size)


@masked_gemm_k.register_fake
def _gemm_k_fake(x, w, mask, group_size):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::cpu_gemm_n", mutates_args=())
def cpu_gemm_n(x: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, group_size: int,
               bias: torch.Tensor | None) -> torch.Tensor:
    from wide_export import cpu

    return cpu.masked_gemm_n(x, w, mask, group_size, bias=bias)


@cpu_gemm_n.register_fake
def _cpu_gemm_n_fake(x, w, mask, group_size, bias):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::cpu_gated", mutates_args=())
def cpu_gated(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, mask: torch.Tensor,
              group_size: int) -> torch.Tensor:
    from wide_export import cpu

    return cpu.masked_gated_mlp(x, w_gate, w_up, mask, group_size)


@cpu_gated.register_fake
def _cpu_gated_fake(x, w_gate, w_up, mask, group_size):
    return x.new_empty((*x.shape[:-1], w_gate.shape[0]))


@torch.library.custom_op(f"{NAMESPACE}::cpu_gemm_kt", mutates_args=())
def cpu_gemm_kt(x: torch.Tensor, wt: torch.Tensor, mask: torch.Tensor, group_size: int) -> torch.Tensor:
    from wide_export import cpu

    return cpu.masked_gemm_kt(x, wt, mask, group_size)


@cpu_gemm_kt.register_fake
def _cpu_gemm_kt_fake(x, wt, mask, group_size):
    return x.new_empty((*x.shape[:-1], wt.shape[1]))
