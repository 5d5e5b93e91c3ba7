"""Assemble a WideForCausalLM from a transformers config, base tensors and routers.

The module is created on the meta device and each tensor is assigned as it is
read, so loading holds one copy of the weights.
"""

from __future__ import annotations

from typing import Any, Iterable

from wide_export.base.errors import WideError


def rope_inv_freq(hf: Any):
    """inv_freq and attention scaling exactly as the family's transformers rotary embedding computes them."""
    import importlib

    from wide_export.model.arch import arch_for

    spec = arch_for(getattr(hf, "model_type", None))
    rope = getattr(importlib.import_module(spec.hf_module), spec.hf_rotary_class)(hf)
    return rope.inv_freq.float(), float(rope.attention_scaling)


def build_model(hf: Any, cfg, base: Iterable[tuple[str, Any]], routers: dict, dtype=None):
    """WideForCausalLM from HF-named (name, tensor) pairs and validated routers (router.routers_from_state)."""
    import torch

    from wide_export.model.modeling import WideForCausalLM

    dtype = dtype or torch.float32
    inv_freq, scaling = rope_inv_freq(hf)
    with torch.device("meta"):
        model = WideForCausalLM(cfg, torch.zeros_like(inv_freq), scaling)
    model.model.inv_freq = inv_freq
    _load_base(model, base, dtype)
    for (layer, kind), tensors in routers.items():
        module = getattr(model.model.layers[layer], f"router_{kind}")
        for key, tensor in tensors.items():
            _set_param(module, key, tensor.float())
    return model.eval()



def _load_base(model, items, dtype) -> None:
    import torch

    params = dict(model.named_parameters(remove_duplicate=False))
    unknown = []
    with torch.no_grad():
        for name, tensor in items:
            if name not in params or ".router_" in name:
                if "rotary_emb" not in name:
                    unknown.append(name)
                continue
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise WideError(f"weight {name} has shape {list(tensor.shape)}, config.json implies "
                                f"{list(params[name].shape)}", "config.json does not match the weights")
            _set_param(model, name, tensor.to(dtype))
    if unknown:
        raise WideError(f"the checkpoint has {len(unknown)} tensors this architecture does not use, e.g. {unknown[0]}",
                        "config.json's model_type does not describe these weights")
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta and ".router_" not in n]
    if missing:
        raise WideError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[0]}",
                        "the model folder is incomplete or of another architecture")


def _set_param(root, dotted: str, value) -> None:
    import torch

    *path, leaf = dotted.split(".")
    mod = root
    for p in path:
        mod = getattr(mod, p)
    setattr(mod, leaf, torch.nn.Parameter(value.contiguous(), requires_grad=False))
