"""A decode step in one call into the CPU kernels (wide_cpu::decode_step: every layer, the final norm, the LM
head), for generation.

The CPU kernels' method (model/methods.py, CpuKernelsMethod.run_decoder) hands a model's decode steps here: one
new token a row, no padding, the preallocated cache (StaticKV), the whole model on
this device, no router masks to record. The op runs the kernels of the per-op path in the reference's order with
its roundings (the same logits, bit for bit: tests/cpu/test_decode_step.py) without the Python and dispatch
between them, which took a quarter of a float16 step of the per-op path (Python run between kernels that stream
weights runs with cold caches). Anything else, or a CPU whose instruction sets the op's attention does not run
on (AVX-512, or AVX2 for head sizes of 8s), returns None and the model runs op by op.

The op takes each layer as a `torch.classes.wide_cpu.DecodeLayer`, made once per plan of the layer's weights and
geometry ints BY NAME (LAYER_WEIGHTS and LAYER_GEOMETRY below: the one table of the names; the op checks each
weight by its name, csrc/step_args.cpp), and each step only the layers' force flags beside the caches."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from wide_export.cpu.ops import _DTYPES, PATHS, KernelArgumentError, available, policy, run_op

MAX_ROWS = 16  # sequences a call takes at most (and at most what the policy gives the masked kernels a call)


@dataclass(frozen=True)
class Weight:
    """A decoder layer's weight as the op takes it: under `name`, the modeling.DecoderLayer parameter's path, which
    the op checks it by (csrc/step_args.cpp: kLayerWeights lists the same names, in this order)."""

    name: str
    optional: bool = False  # a layer may lack it (a bias, Qwen3's q / k norms, a router where the sublayer has none)
    router: bool = False  # a router's: float32 whatever the model's dtype
    transposed_when: str | None = None  # "attention" / "ffn": kept as W^T [K, N] where that sublayer is routed


def _routers() -> tuple:
    return tuple(Weight(f"router_{sub}.{part}.{kind}", optional=True, router=True)
                 for sub in ("attention", "ffn") for part in ("compressor", "router") for kind in ("weight", "bias"))


# The one table of a layer's weights: what the op reads, by name (the op refuses a missing, unknown or mistyped one,
# naming it)
LAYER_WEIGHTS = (
    Weight("input_layernorm.weight"),
    Weight("self_attn.q_proj.weight"),
    Weight("self_attn.q_proj.bias", optional=True),
    Weight("self_attn.k_proj.weight"),
    Weight("self_attn.k_proj.bias", optional=True),
    Weight("self_attn.v_proj.weight"),
    Weight("self_attn.v_proj.bias", optional=True),
    Weight("self_attn.q_norm.weight", optional=True),
    Weight("self_attn.k_norm.weight", optional=True),
    Weight("self_attn.o_proj.weight", transposed_when="attention"),
    Weight("self_attn.o_proj.bias", optional=True),
    Weight("post_attention_layernorm.weight"),
    Weight("mlp.gate_proj.weight"),
    Weight("mlp.up_proj.weight"),
    Weight("mlp.down_proj.weight", transposed_when="ffn"),
    *_routers(),
)
# and of its geometry ints (the op's too): heads and KV heads of head_dim; the attention router's heads a group and
# the FFN router's channels a group, 0 where that sublayer has no router
LAYER_GEOMETRY = ("heads", "kv_heads", "head_dim", "attention_group_heads", "ffn_group_size")


def _get(layer, name: str):
    obj = layer
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _routed(layer) -> dict:
    return {"attention": layer.router_attention is not None, "ffn": layer.router_ffn is not None}


def layer_weights(layer) -> dict:
    """A modeling.DecoderLayer's weights by name (LAYER_WEIGHTS; the ones it lacks left out): the parameters
    themselves, as the module holds them ([N, K]; a routed o_proj / down_proj the [N, K] view of its W^T)."""
    return {w.name: t for w in LAYER_WEIGHTS if (t := _get(layer, w.name)) is not None}


def layer_geometry(layer) -> dict:
    """Its geometry ints by name (LAYER_GEOMETRY)."""
    att, routed = layer.self_attn, _routed(layer)
    return {"heads": att.hq, "kv_heads": att.hkv, "head_dim": att.d,
            "attention_group_heads": layer.attn_group_heads if routed["attention"] else 0,
            "ffn_group_size": layer.ffn_group_size if routed["ffn"] else 0}


@dataclass
class _Plan:
    """The op's arguments of a model's layers that do not change between steps: a wide_cpu.DecodeLayer per layer
    (its weights by name, the parameters themselves, so a prepare() that lays one's data out anew is seen; its
    geometry), the RMSNorm eps; None where the op cannot serve them."""

    layers: list
    eps: float


# layers (nn.ModuleList) -> (parameter registrations seen, dtype, _Plan | None). Any parameter assigned anywhere
# since (a module's weight replaced) makes the plans be built anew: a replaced weight is never read stale.
_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_REGISTRATIONS = [0, None]  # count, the hook's handle (registered on first use, not on import)


def _registered(_module, _name, _param) -> None:
    _REGISTRATIONS[0] += 1


def _servable(layer, dtype: torch.dtype) -> bool:
    """Every weight of the layer of the model's dtype (the routers' float32) and contiguous, a routed o_proj /
    down_proj stored as W^T [K, N] (the CPU method's layout, which the op reads so)."""
    routed = _routed(layer)
    for w in LAYER_WEIGHTS:
        t = _get(layer, w.name)
        if t is None:
            continue
        flip = w.transposed_when is not None and routed[w.transposed_when]
        if t.dtype != (torch.float32 if w.router else dtype) or not (t.t() if flip else t).is_contiguous():
            return False
    return True


def _plan(layers, dtype: torch.dtype) -> _Plan | None:
    """The plan, or None where a weight's dtype or layout is not the op's or the layers' RMSNorm eps differ."""
    eps = {layer.input_layernorm.eps for layer in layers}
    for layer in layers:
        att = layer.self_attn
        eps |= {layer.post_attention_layernorm.eps} | ({att.q_norm.eps, att.k_norm.eps} if att.q_norm else set())
    if len(eps) != 1 or not all(_servable(layer, dtype) for layer in layers):
        return None
    try:
        made = [torch.classes.wide_cpu.DecodeLayer(layer_weights(layer), layer_geometry(layer)) for layer in layers]
    except RuntimeError as err:  # a name the op does not take: a table out of step with the op
        raise KernelArgumentError(f"the CPU kernel refused a layer: {str(err).strip().splitlines()[0]}",
                                  hint="cpu/step.py's LAYER_WEIGHTS must name what csrc/step_args.cpp takes") from None
    return _Plan(made, eps.pop())


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
    logits = h.new_empty(B, 1, head.shape[0])
    # torch's __torch_function__ check of a ScriptObject argument (the layers) costs ~15 us a call; none of these
    # arguments is a tensor subclass that overrides it (a Parameter only disables it)
    with torch._C.DisableTorchFunctionSubclass():
        served = run_op("decode_step", h, plan.layers, [int(layer.force_execute) for layer in layers],
                        [p.k for p in pasts], [p.v for p in pasts], length, cos.reshape(B, -1), sin.reshape(B, -1),
                        plan.eps, norm.weight, head, logits)
    if not served:
        return None
    for p in pasts:
        p.length += 1
    PATHS["step", "fused"] += 1
    return logits.float()
