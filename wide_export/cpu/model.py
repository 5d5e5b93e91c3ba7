"""The reference model made ready for fast CPU generation.

`prepare(model)` stores each routed o_proj / down_proj weight as W^T [K, N] (the module keeps `weight` as the
[N, K] view of that storage, so the reference and every other caller see the same values): each input group's
weights are then one contiguous block that the K-pruned kernel streams at decode (ops.masked_gemm_kt), and the
dense GEMM that serves prefill reads the same storage. One copy of the weights. Inside
`dispatch.cpu_kernels()` the model then runs the compiled kernels, torch's fused attention and, with
model.static_cache, a preallocated KV cache (model/generate.py: generate)."""

from __future__ import annotations

import torch

from wide_export.cpu.ops import available

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def prepare(model) -> int:
    """Lay the routed K-pruned projections of `model` (wide_export.model.modeling.WideForCausalLM) out for the
    CPU kernel; returns how many (0 where the kernels are not built or the dtype is not theirs)."""
    if model.dtype not in DTYPES or not available():
        return 0
    done = 0
    for layer in model.model.layers:
        for linear, routed in ((layer.self_attn.o_proj, layer.attn_group_heads),
                               (layer.mlp.down_proj, layer.ffn_group_size)):
            if routed and linear.weight.is_contiguous():
                linear.weight.data = linear.weight.data.t().contiguous().t()
                done += 1
    return done
