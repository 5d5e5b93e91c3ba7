"""A decode step in one call into the CPU kernels (wide_cpu::decode_step: every layer, the final norm, the LM
head), for generation.

model/modeling.py's WideForCausalLM.forward hands its decode steps here on the fast CPU path
(dispatch.cpu_kernels): one new token a row, no padding, the preallocated cache (StaticKV), the whole model on
this device, no router masks to record. The op runs the kernels of the per-op path in the reference's order with
its roundings (the same logits, bit for bit: tests/cpu/test_decode_step.py) without the Python and dispatch
between them, which took a quarter of a float16 step of the per-op path (Python run between kernels that stream
weights runs with cold caches). Anything else, or a CPU whose instruction sets the op's attention does not run
on (AVX-512, or AVX2 for head sizes of 8s), returns None and the model runs op by op."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from wide_export.cpu.ops import _DTYPES, PATHS, available, policy, run_op

MAX_ROWS = 16  # sequences a call takes at most (and at most what the policy gives the masked kernels a call)
ROUTERS_FROM = 15  # layer_weights: the routers' float32 weights come last
LAYER_GEO, FORCE = 6, 5  # wide_cpu.cpp: geometry ints per layer; the force flag's place among them


def _router(router) -> list:
    if router is None:
        return [None] * 4
    return [router.compressor.weight, router.compressor.bias, router.router.weight, router.router.bias]


def layer_weights(layer) -> list:
    """A modeling.DecoderLayer's 23 weights in the op's order (wide_cpu.cpp: decode_step, LAYER_WEIGHTS); o_proj /
    down_proj as the module holds them ([N, K]; the op reads a routed one as W^T, see _plan)."""
    att, mlp = layer.self_attn, layer.mlp
    qn, kn = (None, None) if att.q_norm is None else (att.q_norm.weight, att.k_norm.weight)
    return [layer.input_layernorm.weight, att.q_proj.weight, att.q_proj.bias, att.k_proj.weight, att.k_proj.bias,
            att.v_proj.weight, att.v_proj.bias, qn, kn, att.o_proj.weight, att.o_proj.bias,
            layer.post_attention_layernorm.weight, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
            *_router(layer.router_attention), *_router(layer.router_ffn)]


@dataclass
class _Plan:
    """The op's arguments of a model's layers that do not change between steps: the weights (the parameters
    themselves, so a prepare() that lays one's data out anew is seen), the indices the op reads transposed,
    the geometry ints (force flags 0: read per call), the RMSNorm eps; None where the op cannot serve them."""

    weights: list
    transposed: list[int]
    geo: list[int]
    eps: float


# layers (nn.ModuleList) -> (parameter registrations seen, dtype, _Plan | None). Any parameter assigned anywhere
# since (a module's weight replaced) makes the plans be built anew: a replaced weight is never read stale.
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_REGISTRATIONS = [0, None]  # count, the hook's handle (registered on first use, not on import)


def _registered(_module, _name, _param) -> None:
    _REGISTRATIONS[0] += 1


def _plan(layers, dtype: torch.dtype) -> _Plan | None:
    """Every weight contiguous and of the model's dtype (the routers' float32), a routed o_proj / down_proj stored
    as W^T [K, N] (cpu/model.py: prepare; the op reads it so), one RMSNorm eps: the plan; else None."""
    weights, transposed, geo, eps = [], [], [], {layer.input_layernorm.eps for layer in layers}
    for layer in layers:
        w = layer_weights(layer)
        att = layer.self_attn
        routed = (layer.router_attention is not None, layer.router_ffn is not None)
        flip = [i for i, on in ((9, routed[0]), (14, routed[1])) if on]
        if any(t is not None and (not (t.t() if i in flip else t).is_contiguous()
                                  or t.dtype != (torch.float32 if i >= ROUTERS_FROM else dtype))
               for i, t in enumerate(w)):
            return None
        eps |= {layer.post_attention_layernorm.eps} | ({att.q_norm.eps, att.k_norm.eps} if att.q_norm else set())
        transposed += [len(weights) + i for i in flip]
        weights += w
        geo += [att.hq, att.hkv, att.d, layer.attn_group_heads if routed[0] else 0,
                layer.ffn_group_size if routed[1] else 0, 0]
    return _Plan(weights, transposed, geo, eps.pop()) if len(eps) == 1 else None


def _cached_plan(layers, dtype: torch.dtype) -> _Plan | None:
    if _REGISTRATIONS[1] is None:
        _REGISTRATIONS[1] = torch.nn.modules.module.register_module_parameter_registration_hook(_registered)
    seen = _PLANS.get(layers)
    if seen is None or seen[0] != _REGISTRATIONS[0] or seen[1] != dtype:
        seen = _PLANS[layers] = (_REGISTRATIONS[0], dtype, _plan(layers, dtype))
    return seen[2]


def _max_rows(dtype: torch.dtype) -> int:
    m = policy(str(dtype)[6:])["masked_max_m"]
    return min(MAX_ROWS, m["n"], m["gated"], m["k"])


def decode_step(model, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention_mask: torch.Tensor,
                pasts) -> torch.Tensor | None:
    """The logits [B, 1, V] (float32) of a modeling.WideForCausalLM's decode step, h [B, 1, H] its embedded new
    tokens, each layer's keys and values written into its `pasts` entry (a modeling.StaticKV, whose length grows by
    1); or None (nothing changed) where the fused op does not serve: the caller then runs the model op by op."""
    B, T, H = h.shape
    layers = model.model.layers
    if T != 1 or B > _max_rows(h.dtype) or h.dtype not in _DTYPES or not h.is_contiguous() or not available() \
            or any(layer.shard is not None for layer in layers) or not bool(attention_mask.all()):
        return None  # a prefill, too many rows, padding (the op attends to every position), a shard
    length = getattr(pasts[0], "length", None)
    if length is None or any(getattr(p, "length", -1) != length or p.k.shape[2] <= length for p in pasts):
        return None  # a tuple cache, caches of different lengths, or one that is full
    head, norm = model.lm_head.weight, model.model.norm
    if (plan := _cached_plan(layers, h.dtype)) is None or norm.eps != plan.eps or head.dtype != h.dtype \
            or norm.weight.dtype != h.dtype or not head.is_contiguous() or model.lm_head.bias is not None:
        return None
    w = list(plan.weights)
    for i in plan.transposed:
        w[i] = w[i].t()
    geo = list(plan.geo)
    for i, layer in enumerate(layers):
        geo[LAYER_GEO * i + FORCE] = int(layer.force_execute)
    logits = h.new_empty(B, 1, head.shape[0])
    if not run_op("decode_step", h, w, [p.k for p in pasts], [p.v for p in pasts], length, cos.reshape(B, -1),
                  sin.reshape(B, -1), plan.eps, geo, norm.weight, head, logits):
        return None
    for p in pasts:
        p.length += 1
    PATHS["step", "fused"] += 1
    return logits.float()
