"""Merge the stage-2 LoRA of the WIDE recipe: W += (B @ A) * scale."""

from __future__ import annotations

import re
from pathlib import Path

from wide_export.checkpoint.torchfile import load_tensor_dict, strip_to_layer_keys
from wide_export.base.errors import WideError

LORA_KEY = re.compile(r"^(self_attn|mlp)\.(\w+_proj)\.lora_(A|B)\b")
# LoRA scales are alpha / r, a few units; a scale this large only makes the merged weights overflow
MAX_LORA_SCALE = 1000.0


def check_lora_scale(scale, what: str = "--lora-scale", hint: str | None = None) -> float:
    """A finite number of magnitude at most MAX_LORA_SCALE (WideError otherwise)."""
    import math

    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or abs(scale) > MAX_LORA_SCALE:
        raise WideError(f"{what} is {scale!r}: a LoRA scale must be a finite number between "
                        f"-{MAX_LORA_SCALE:g} and {MAX_LORA_SCALE:g}",
                        hint or "pass the trainer's lora_alpha / r (the WIDE recipe's default is 2.0)")
    return float(scale)


def merged(weight, a, b, scale: float, name: str):
    """weight + (B @ A) * scale in weight's dtype; a WideError when a value is no longer finite."""
    import torch

    out = (weight.float() + (b.float() @ a.float()) * scale).to(weight.dtype)
    if not bool(torch.isfinite(out).all()):
        raise WideError(f"merging the LoRA into {name} gives non-finite values (NaN or Inf)",
                        "check the LoRA file and --lora-scale: the merged weight overflows its dtype")
    return out


def merge_lora(model, path: Path, scale: float) -> int:
    """Merge every LoRA pair of `path` into `model` in place; return the number merged."""
    import torch

    params = dict(model.named_parameters())
    pairs = lora_pairs(model, path)
    for name, (a, b) in pairs.items():
        weight = params[name]
        with torch.no_grad():
            weight.copy_(merged(weight, a, b, scale, name))
    return len(pairs)


def lora_pairs(model, path: Path) -> dict:
    """{weight parameter name: (A, B)} for every LoRA pair of `path`, checked against `model`'s shapes
    (the model may hold placeholder weights: only shapes are read)."""
    import torch

    pairs: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for (layer, rest), tensor in strip_to_layer_keys(load_tensor_dict(path, "LoRA")).items():
        m = LORA_KEY.match(rest)
        if m:
            pairs.setdefault((layer, m.group(1), m.group(2)), {})[m.group(3)] = tensor
    if not pairs:
        raise WideError(f"no LoRA tensors in {path}",
                        "expected keys like model.layers.0.self_attn.q_proj.lora_A.weight")
    layers = model.model.layers
    out = {}
    for (layer, block, proj), ab in sorted(pairs.items()):
        where = f"{Path(path).name}: layer {layer} {block}.{proj}"
        if set(ab) != {"A", "B"}:
            raise WideError(f"{where}: has lora_{''.join(ab)} without its partner", "the LoRA file is incomplete")
        if layer >= len(layers) or not hasattr(getattr(layers[layer], block), proj):
            raise WideError(f"{where}: no such projection in this model", "pass the LoRA trained for this model")
        weight = getattr(getattr(layers[layer], block), proj).weight
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != tuple(weight.shape):
            raise WideError(f"{where}: A {list(a.shape)} and B {list(b.shape)} do not fit weight "
                            f"{list(weight.shape)}", "pass the LoRA trained for this model")
        out[f"model.layers.{layer}.{block}.{proj}.weight"] = (a, b)
    return out
