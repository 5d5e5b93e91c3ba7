"""WIDE's masked projections on vLLM's own layers: the methods of model/methods.py (MaskedProjectionMethod) for
vLLM's QKVParallelLinear / MergedColumnParallelLinear / RowParallelLinear, one chosen when the model is built
(model.py: `--additional-config '{"wide_kernels": ...}'` / WIDE_VLLM_KERNELS, resolved once) and held by each
routed sublayer and router; an unrouted sublayer holds the native one. Each layer calls its method:

    q, k, v = method.qkv(attn, x, mask)      # the attention's q / k / v (q of skipped head groups 0 or unread)
    y = method.out(attn, o, mask)            # o_proj over the executed heads, summed over the ranks
    y = method.mlp(mlp, x, mask)             # gate/up + SiLU over the executed channels, down_proj, summed
    mask = method.route(router, h)

* VllmNativeMethod (any device): the mask multiplies the activations, vLLM's layers run as they are.
* VllmTritonMethod (CUDA, unquantised layers without LoRA wrappers): the router and the masked gate/up and down
  GEMMs run our Triton kernels as torch custom ops (ops.py), which skip the weights of skipped groups.
* VllmCpuMethod (vLLM's CPU backend, unquantised, no LoRA adapters): a CpuKernelsMethod, so o_proj / down_proj
  are laid out as W^T by the reference decoder's own CPU re-layout (process_weights_after_loading: one copy,
  read by the K-pruned kernel and the dense GEMM alike); q_proj, gate/up + SiLU, o_proj and down_proj run
  wide_export.cpu's kernels as custom ops; k / v go to vLLM's own CPU GEMM.

o_proj / down_proj partial sums are all-reduced as RowParallelLinear does.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear,
                                               UnquantizedLinearMethod)

from wide_export.model.methods import CpuKernelsMethod, MaskedProjectionMethod
from wide_export.ops.reference import expand_mask, wide_router


def _plain(layer: nn.Module, cls: type) -> bool:
    """`layer` is vLLM's own `cls`, unquantised, not wrapped by LoRA, and keeps its [N, K] weight (vLLM's CPU
    backend repacks it for its own GEMM and empties `weight`): our kernels can read that weight."""
    weight = getattr(layer, "weight", None)
    return (type(layer) is cls and isinstance(getattr(layer, "quant_method", None), UnquantizedLinearMethod)
            and isinstance(weight, torch.Tensor) and weight.dim() == 2)


def _zero_skipped(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x [T, G * gs] with the channels of groups where mask [T, G] is off set to 0 (group g owns channels
    g * gs .. (g + 1) * gs - 1: ops/reference.py's expand_mask, the rule of every masked op)."""
    return x * expand_mask(mask, x.shape[-1] // mask.shape[-1], x.dtype)


def _row_parallel(layer: RowParallelLinear, y: torch.Tensor) -> torch.Tensor:
    """Finish a row-parallel product computed outside the layer: sum over ranks, then the bias once."""
    if layer.tp_size > 1:
        y = tensor_model_parallel_all_reduce(y)
    if layer.bias is not None:
        y = y + layer.bias
    return y


def _split_kv(layer: QKVParallelLinear, q_size: int) -> bool:
    """Split a routed qkv layer's weight after load: the q rows stay ours (`layer.wide_q`, read by the masked
    kernel), the k and v rows go to vLLM's own CPU GEMM (`layer.wide_kv`: the one its dense layers get, oneDNN
    on a weight it prepacks), which at a batch of tokens is much faster than F.linear on the plain rows. Each
    row is kept once. Where vLLM has no such dispatch, the rows stay in `weight` and F.linear reads them."""
    w = layer.weight.data
    if w.dim() != 2 or w.numel() == 0:
        return False  # split already (its weight emptied), or not loaded as [N, K]
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:
        return False
    kv = nn.Module()
    kv.weight = nn.Parameter(w[q_size:].clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(kv, remove_weight=True)
    if not callable(getattr(kv, "cpu_linear", None)):
        return False
    layer.register_buffer("wide_q", w[:q_size].clone(), persistent=False)
    layer.wide_kv = kv
    layer.weight = nn.Parameter(w.new_empty(0), requires_grad=False)
    return True


class VllmNativeMethod(MaskedProjectionMethod):
    """The mask multiplies the activations; vLLM's layers (and their GEMMs) run as they are."""

    name = "native"

    def claim(self, *layers: nn.Module) -> None:
        """Called when a sublayer is built, with its projections (before any weight is loaded)."""

    def for_router(self, rank: int) -> MaskedProjectionMethod:
        """The method a router of compressor rank `rank` holds."""
        return NATIVE

    def route(self, router, h):
        """The int32 mask [T, G] for the whole model (every rank takes its slice): the rule itself
        (ops/reference.py's wide_router, the PyTorch decoder's oracle)."""
        c, r = router.compressor, router.router
        return wide_router(h, c.weight, c.bias, r.weight, r.bias)

    def qkv(self, attn, x, mask):
        qkv, _ = attn.qkv_proj(x)
        return qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)

    def out(self, attn, o, mask):
        if mask is None:
            return attn.o_proj(o)[0]
        return attn.o_proj(_zero_skipped(o, mask))[0]

    def mlp(self, mlp, x, mask):
        y = mlp.act_fn(mlp.gate_up_proj(x)[0])
        if mask is not None:
            y = _zero_skipped(y, mask)
        return mlp.down_proj(y)[0]


NATIVE = VllmNativeMethod()


class VllmTritonMethod(VllmNativeMethod):
    """The router and the masked gate/up and down GEMMs run our Triton kernels (torch.ops.wide_vllm); a layer
    the kernels cannot read (quantised, wrapped by LoRA, repacked) runs native."""

    name = "triton"

    def for_router(self, rank: int) -> MaskedProjectionMethod:
        from wide_export.kernels.configs import router_block_r

        return self if router_block_r(rank) else NATIVE  # the fused router's rank limit: native above it

    def route(self, router, h):
        c, r = router.compressor, router.router
        return torch.ops.wide_vllm.router(h, c.weight, c.bias, r.weight, r.bias)

    def out(self, attn, o, mask):
        if mask is not None and _plain(attn.o_proj, RowParallelLinear):
            return _row_parallel(attn.o_proj, torch.ops.wide_vllm.masked_gemm_k(o, attn.o_proj.weight, mask,
                                                                                 attn.group_width))
        return super().out(attn, o, mask)

    def mlp(self, mlp, x, mask):
        if mask is not None and _plain(mlp.gate_up_proj, MergedColumnParallelLinear) \
                and _plain(mlp.down_proj, RowParallelLinear):
            w = mlp.gate_up_proj.weight
            n = w.shape[0] // 2
            y = torch.ops.wide_vllm.masked_gated_mlp(x, w[:n], w[n:], mask, mlp.group_size)
            return _row_parallel(mlp.down_proj, torch.ops.wide_vllm.masked_gemm_k(y, mlp.down_proj.weight, mask,
                                                                                    mlp.group_size))
        return super().mlp(mlp, x, mask)


class VllmCpuMethod(CpuKernelsMethod):
    """wide_export.cpu's kernels on vLLM's CPU backend: routed sublayers keep their own weight layout (q/k/v and
    gate/up as loaded, o_proj / down_proj as W^T [K, N] by CpuKernelsMethod's re-layout, the module's `weight` its
    [N, K] view) instead of vLLM's repacked copy, so the weights stay one copy; k and v rows go to vLLM's GEMM."""

    name = "cpu"

    def __init__(self):
        super().__init__(fused_step=False)

    def __reduce__(self):
        return type(self), ()

    def __repr__(self) -> str:
        return "VllmCpuMethod()"

    def claim(self, *layers: nn.Module) -> None:
        """Keep vLLM's CPU backend from repacking these layers' weights for its GEMM (and emptying `weight`): our
        kernels read them (vLLM's flag for layers whose weight another op reads; their own GEMM is F.linear)."""
        for layer in layers:
            layer._cpu_skip_gemm_dispatch = True

    def for_router(self, rank: int) -> MaskedProjectionMethod:
        return NATIVE  # on CPU the router is two small torch GEMMs

    def process_weights_after_loading(self, layer) -> bool:
        if isinstance(layer, QKVParallelLinear):
            return _split_kv(layer, layer.num_heads * layer.head_size)
        return super().process_weights_after_loading(layer)  # o_proj / down_proj: W^T, once

    route = VllmNativeMethod.route

    def qkv(self, attn, x, mask):
        """q of the executed head groups only (the others' q is 0: their attention output is never read), k
        and v dense (the KV cache stays complete)."""
        if mask is None:
            return VllmNativeMethod.qkv(self, attn, x, mask)
        layer, q = attn.qkv_proj, attn.q_size
        b, split = layer.bias, getattr(layer, "wide_kv", None)
        wq = layer.weight[:q] if split is None else layer.wide_q
        qs = torch.ops.wide_vllm.cpu_gemm_n(x, wq, mask, attn.group_width, None if b is None else b[:q])
        bkv = None if b is None else b[q:]
        kv = nn.functional.linear(x, layer.weight[q:], bkv) if split is None else split.cpu_linear(x, None, bkv)
        k, v = kv.split([attn.kv_size, attn.kv_size], dim=-1)
        return qs, k, v

    def out(self, attn, o, mask):
        if mask is None:
            return VllmNativeMethod.out(self, attn, o, mask)
        return _row_parallel(attn.o_proj, torch.ops.wide_vllm.cpu_gemm_kt(o, attn.o_proj.weight.t(), mask,
                                                                          attn.group_width))

    def mlp(self, mlp, x, mask):
        if mask is None:
            return VllmNativeMethod.mlp(self, mlp, x, mask)
        w = mlp.gate_up_proj.weight
        n = w.shape[0] // 2  # this rank's channels: gate rows, then up rows
        y = torch.ops.wide_vllm.cpu_gated(x, w[:n], w[n:], mask, mlp.group_size)
        return _row_parallel(mlp.down_proj, torch.ops.wide_vllm.cpu_gemm_kt(y, mlp.down_proj.weight.t(), mask,
                                                                            mlp.group_size))


METHODS = {"native": VllmNativeMethod, "triton": VllmTritonMethod, "cpu": VllmCpuMethod}
