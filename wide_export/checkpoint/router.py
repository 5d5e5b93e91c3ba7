"""router.pth: read the routers and the routing geometry off the tensor shapes."""

from __future__ import annotations

import re
from pathlib import Path

from wide_export.checkpoint.torchfile import load_tensor_dict, strip_to_layer_keys
from wide_export.base.errors import WideError
from wide_export.model.config import WideConfig

ROUTER_KEY = re.compile(r"^router_(attention|ffn)\.(compressor|router)\.(weight|bias)$")
HINT = "this router.pth was trained for a different base model; pass the matching --model/--router pair"


def read_routers(path: Path, cfg: WideConfig, attn_group_size: int | None = None,
                 ffn_group_size: int | None = None) -> dict[tuple[int, str], dict]:
    """Validate router.pth against `cfg`, fill cfg.routing, return {(layer, kind): tensors}."""
    return routers_from_state(load_tensor_dict(path, "router"), cfg, Path(path).name,
                              attn_group_size, ffn_group_size)


def routers_from_state(state: dict, cfg: WideConfig, source: str = "router.pth",
                       attn_group_size: int | None = None, ffn_group_size: int | None = None) -> dict:
    """Same as read_routers, on an in-memory state dict."""
    sd = strip_to_layer_keys(state)
    routers: dict[tuple[int, str], dict] = {}
    for (layer, rest), tensor in sd.items():
        m = ROUTER_KEY.match(rest)
        if m:
            kind, lin, par = m.groups()
            routers.setdefault((layer, kind), {})[f"{lin}.{par}"] = tensor
    if not routers:
        raise WideError(f"no router tensors in {source}",
                        "expected keys like model.layers.0.router_ffn.compressor.weight (WIDE trainer output)")
    for (layer, kind), t in sorted(routers.items()):
        _check_router(source, cfg, layer, kind, t)
    for (layer, kind), t in routers.items():
        groups, rank = t["router.weight"].shape[0] // 2, t["compressor.weight"].shape[0]
        r = cfg.routing[layer]
        if kind == "attention":
            r.attn_groups, r.attn_rank = groups, rank
        else:
            r.ffn_groups, r.ffn_rank = groups, rank
    check_group_flags(cfg, attn_group_size, ffn_group_size)
    return routers


def _check_router(source: str, cfg: WideConfig, layer: int, kind: str, t: dict) -> None:
    where = f"{source}: layer {layer} router_{kind}"
    if layer >= cfg.num_layers:
        raise WideError(f"{where}: the model has only {cfg.num_layers} layers", HINT)
    missing = {"compressor.weight", "compressor.bias", "router.weight", "router.bias"} - set(t)
    if missing:
        raise WideError(f"{where}: missing {', '.join(sorted(missing))}", "the router file is incomplete")
    cw, cb, rw, rb = (t[k] for k in ("compressor.weight", "compressor.bias", "router.weight", "router.bias"))
    for key in ("compressor.weight", "compressor.bias", "router.weight", "router.bias"):
        check_finite(t[key], f"{where}.{key}", "the router file is damaged or was saved from a diverged run; "
                     "pass a router.pth whose values are all finite")
    if cw.dim() != 2 or cw.shape[1] != cfg.hidden_size:
        raise WideError(f"{where}: compressor.weight has shape {list(cw.shape)}, "
                        f"expected [R, {cfg.hidden_size}] (hidden size)", HINT)
    rank = cw.shape[0]
    if list(cb.shape) != [rank] or rw.dim() != 2 or rw.shape[1] != rank or rw.shape[0] % 2:
        raise WideError(f"{where}: inconsistent shapes compressor {list(cw.shape)}, router {list(rw.shape)}",
                        "router.weight must be [2G, R] for compressor.weight [R, H]")
    if list(rb.shape) != [rw.shape[0]]:
        raise WideError(f"{where}: router.bias has shape {list(rb.shape)}, expected [{rw.shape[0]}]",
                        "the router file is inconsistent")
    groups = rw.shape[0] // 2
    width, unit = ((cfg.num_attention_heads, "attention heads") if kind == "attention"
                   else (cfg.intermediate_size, "FFN channels"))
    if width % groups:
        raise WideError(f"{where}: {groups} groups do not divide the {width} {unit}", HINT)


def check_finite(tensor, where: str, hint: str) -> None:
    """Refuse a tensor that is not floating point or holds NaN / Inf: a router decides nothing sensible on it."""
    import torch

    if not tensor.is_floating_point():
        raise WideError(f"{where} is {str(tensor.dtype).replace('torch.', '')}, not a floating-point tensor", hint)
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise WideError(f"{where} holds {bad} non-finite values (NaN or Inf)", hint)


def check_group_flags(cfg: WideConfig, attn_group_size: int | None, ffn_group_size: int | None) -> None:
    """--attn-group-size / --ffn-group-size are checks against the routing, never overrides."""
    _check_flag(cfg, "attention", attn_group_size, "--attn-group-size", cfg.attn_group_size)
    _check_flag(cfg, "ffn", ffn_group_size, "--ffn-group-size", cfg.ffn_group_size)


def _check_flag(cfg: WideConfig, kind: str, flag: int | None, name: str, size_of) -> None:
    if flag is None:
        return
    sizes = {size_of(i) for i in range(cfg.num_layers)} - {None}
    if not sizes:
        raise WideError(f"{name}={flag} given but the router file has no {kind} routers",
                        f"drop {name} or pass a router file with router_{kind} tensors")
    if sizes != {flag}:
        found = ", ".join(str(s) for s in sorted(sizes))
        raise WideError(f"{name}={flag} disagrees with the router file, whose group size is {found}",
                        f"drop {name}: group sizes are read from the router file")
