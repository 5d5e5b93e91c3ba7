"""WIDE routing applied to a plain transformers model by hand, independent of wide_export.

Everything the WIDE contract says (README of the method, restated in our words):
* the attention router reads the residual stream entering the decoder layer
  (before input_layernorm); the FFN router reads the residual stream entering
  post_attention_layernorm (after the attention residual add);
* router: z = h Wc^T + bc, l = z Wr^T + br viewed as [.., G, 2];
  group g executes iff l[g, 0] >= l[g, 1];
* attention: query head j is in group j // (heads / G); a skipped group's heads
  are zeroed in the attention output before o_proj;
* FFN: channel c of silu(gate) * up is in group c // (intermediate / G);
  skipped channels are zero (down_proj's input).

Only torch, transformers and the files on disk are used here: the router file
is parsed with its own regular expression, LoRA is merged with its own loop,
and masks are applied with forward pre-hooks on the transformers modules. This
module imports nothing from wide_export.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

ROUTER_KEY = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.router_(attention|ffn)\.(compressor|router)\.(weight|bias)$")
LORA_KEY = re.compile(r"(?:^|\.)model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.lora_(A|B)\.")


def read_routers(path: Path) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """(layer, 'attention'|'ffn') -> {'wc','bc','wr','br'} in float32, straight from router.pth."""
    routers: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    short = {("compressor", "weight"): "wc", ("compressor", "bias"): "bc",
             ("router", "weight"): "wr", ("router", "bias"): "br"}
    for key, tensor in torch.load(path, map_location="cpu", weights_only=True).items():
        m = ROUTER_KEY.search(key)
        if m:
            routers.setdefault((int(m.group(1)), m.group(2)), {})[short[m.group(3), m.group(4)]] = tensor.float()
    return routers


def hand_route(h: torch.Tensor, r: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(execute mask bool [B, T, G], margin logit0 - logit1 [B, T, G]) computed in float64 by hand."""
    h = h.double()
    z = h @ r["wc"].double().T + r["bc"].double()
    logits = z @ r["wr"].double().T + r["br"].double()
    pairs = logits.reshape(*logits.shape[:-1], -1, 2)
    margin = pairs[..., 0] - pairs[..., 1]
    return margin >= 0, margin


def merge_lora_by_hand(hf_model, path: Path, scale: float) -> int:
    """W += (B @ A) * scale for every lora_A/lora_B pair in `path`; returns the number of pairs."""
    found: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in torch.load(path, map_location="cpu", weights_only=True).items():
        m = LORA_KEY.search(key)
        if m:
            found.setdefault((int(m.group(1)), m.group(2), m.group(3)), {})[m.group(4)] = tensor.float()
    with torch.no_grad():
        for (layer, block, proj), ab in found.items():
            linear = getattr(getattr(hf_model.model.layers[layer], block), proj)
            linear.weight += (ab["B"] @ ab["A"]) * scale
    return len(found)


@dataclass
class RoutedHF:
    """A transformers causal LM with WIDE routing applied through forward pre-hooks.

    After each forward, `masks[(layer, kind)]` / `margins[(layer, kind)]` hold the
    decisions of the last call ([B, T, G]).
    """

    model: torch.nn.Module
    routers: dict[tuple[int, str], dict[str, torch.Tensor]]
    masks: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    margins: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    handles: list = field(default_factory=list)

    def __post_init__(self):
        cfg = self.model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        for i, layer in enumerate(self.model.model.layers):
            if (i, "attention") in self.routers:
                groups = self.routers[i, "attention"]["wr"].shape[0] // 2
                per_group = (heads // groups) * head_dim  # o_proj input channels per group
                self._hook(layer, self._decide(i, "attention"))
                self._hook(layer.self_attn.o_proj, self._zero(i, "attention", per_group))
            if (i, "ffn") in self.routers:
                groups = self.routers[i, "ffn"]["wr"].shape[0] // 2
                per_group = cfg.intermediate_size // groups
                self._hook(layer.post_attention_layernorm, self._decide(i, "ffn"))
                self._hook(layer.mlp.down_proj, self._zero(i, "ffn", per_group))

    def _hook(self, module, fn):
        self.handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))

    def _decide(self, layer: int, kind: str):
        def hook(_module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.masks[layer, kind], self.margins[layer, kind] = hand_route(h, self.routers[layer, kind])

        return hook

    def _zero(self, layer: int, kind: str, per_group: int):
        def hook(_module, args, kwargs):
            x = args[0] if args else kwargs["input"]
            keep = self.masks[layer, kind].to(x.dtype).repeat_interleave(per_group, dim=-1)
            assert keep.shape == x.shape, (keep.shape, x.shape)
            x = x * keep
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "input": x})

        return hook

    def __call__(self, **kw):
        self.masks.clear()
        self.margins.clear()
        with torch.no_grad():
            return self.model(**kw)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def load_routed_hf(folder: Path, *, lora: Path | None = None, lora_scale: float = 2.0) -> RoutedHF:
    """The checkpoint's base model in transformers (float32), LoRA merged by hand, routers hooked."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    if lora is not None:
        assert merge_lora_by_hand(hf, lora, lora_scale) > 0
    return RoutedHF(hf, read_routers(Path(folder) / "router.pth"))
