"""The reference model made ready for fast CPU generation.

`prepare(model)` gives each routed o_proj / down_proj a copy of its weight in the K-pruned kernel's packed
layout (ops.pack_k, a non-persistent buffer `wide_packed`): decode streams the executed groups' blocks whole
instead of reading a gap in every row of [N, K]. The [N, K] weight stays for the dense GEMM that serves
prefill (policy.json), so those two projections are held twice. Inside `dispatch.cpu_kernels()` the model
then runs the compiled kernels, torch's fused attention and, with model.static_cache, a preallocated KV cache
(model/generate.py: generate)."""

from __future__ import annotations

import torch

from wide_export.cpu.ops import PACK_KB, available, pack_k

DTYPES = (torch.float32, torch.bfloat16)


def prepare(model) -> int:
    """Pack the routed K-pruned projections of `model` (wide_export.model.modeling.WideForCausalLM) for the
    CPU kernel; returns how many were packed (0 where the kernels are not built or the dtype is not theirs)."""
    if model.dtype not in DTYPES or not available():
        return 0
    packed = 0
    for layer in model.model.layers:
        for linear, group in ((layer.self_attn.o_proj, layer.attn_group_heads and
                               layer.attn_group_heads * layer.self_attn.d),
                              (layer.mlp.down_proj, layer.ffn_group_size)):
            w = linear.weight
            if not group or w.shape[0] % PACK_KB or w.shape[1] % group:
                continue
            linear.register_buffer("wide_packed", pack_k(w.detach(), group), persistent=False)
            packed += 1
    return packed
