"""The vLLM folder's contract: config.json's `wide` section, written by `wide-export vllm`, read by the plugin.

A folder is a Hugging Face checkpoint vLLM loads as it is: the base model's
config.json with `architectures` set to our name for its family
(arch.ArchSpec.vllm_architecture) and a `wide` section; safetensors with the
base weights (LoRA merged) and the routers under their trainer names
(`model.layers.{i}.router_{attention|ffn}.{compressor|router}.{weight|bias}`,
float32); the tokenizer files. The section says which layer has which router
and its shape, so the plugin builds the right modules before any weight is read
and refuses a folder whose config and weights disagree (checks here, shared by
the writer's tests and the loader; no vLLM import).
"""

from __future__ import annotations

from typing import Any

from wide_export.base.errors import WideError
from wide_export.base.names import VLLM_FORMAT as FORMAT
from wide_export.base.names import VLLM_SECTION as SECTION

VERSION = 1
HINT = "re-create the folder with `wide-export vllm --output DIR`"
MAX_TP = 64  # tensor_parallel_sizes lists the world sizes up to this that split no group


def router_shapes(cfg, layer: int, kind: str) -> dict[str, tuple[int, ...]]:
    """Parameter name (under `router_{kind}.`) -> shape, for a routed sublayer of `cfg`."""
    r = cfg.routing[layer]
    groups, rank = (r.attn_groups, r.attn_rank) if kind == "attention" else (r.ffn_groups, r.ffn_rank)
    h = cfg.hidden_size
    return {"compressor.weight": (rank, h), "compressor.bias": (rank,),
            "router.weight": (2 * groups, rank), "router.bias": (2 * groups,)}


def tp_sizes(cfg) -> list[int]:
    """World sizes (up to MAX_TP) whose split keeps every head group and FFN group on one rank (tp/plan.py)."""
    from wide_export.tp.plan import check_tp

    ok = []
    for n in range(1, MAX_TP + 1):
        try:
            check_tp(cfg, n)
        except WideError:
            continue
        ok.append(n)
    return ok


def wide_section(cfg, *, dtype: str, sources: dict, lora_pairs: int, lora_scale: float | None,
                 demo: bool) -> dict[str, Any]:
    """config.json's `wide` section for a loaded model's WideConfig."""
    from wide_export import __version__

    layers = []
    for i, r in enumerate(cfg.routing):
        layers.append({
            "attention": None if r.attn_groups is None else {
                "groups": r.attn_groups, "rank": r.attn_rank, "heads_per_group": cfg.attn_group_size(i)},
            "ffn": None if r.ffn_groups is None else {
                "groups": r.ffn_groups, "rank": r.ffn_rank, "group_size": cfg.ffn_group_size(i)},
        })
    return {
        "format": FORMAT,
        "version": VERSION,
        "wide_export_version": __version__,
        "demo": demo,
        "dtype": dtype,
        "router_dtype": "float32",
        "router_input": "pre-norm residual stream",
        "layers": layers,
        "tensor_parallel_sizes": tp_sizes(cfg),
        "lora": None if not lora_pairs else {"merged_pairs": lora_pairs, "scale": lora_scale},
        "sources": sources,
    }


def _int(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise WideError(f"{where} is {value!r}, not a positive integer", HINT)
    return value


def config_from_hf(hf) -> Any:
    """The WideConfig of a vLLM folder's transformers config (its `wide` attribute holds the section).

    Refuses, with one message, a config without a section of our format, a section whose layer list does not
    match num_hidden_layers, group counts that do not divide the heads / FFN channels, and an architecture
    name of another family than model_type."""
    from wide_export.model.arch import arch_for
    from wide_export.model.config import WideConfig

    section = getattr(hf, SECTION, None)
    if not isinstance(section, dict) or section.get("format") != FORMAT:
        raise WideError("config.json has no `wide` section of a wide-export vLLM folder", HINT)
    if section.get("version") != VERSION:
        raise WideError(f"the folder's `wide` section is version {section.get('version')!r}; this wide-export "
                        f"reads version {VERSION}", HINT)
    cfg = WideConfig.from_hf(hf)
    want = arch_for(cfg.model_type).vllm_architecture
    archs = list(getattr(hf, "architectures", None) or [])
    if archs != [want]:
        raise WideError(f"config.json declares architectures {archs}, a {cfg.model_type} WIDE folder is {[want]}",
                        HINT)
    layers = section.get("layers")
    if not isinstance(layers, list) or len(layers) != cfg.num_layers:
        got = len(layers) if isinstance(layers, list) else "no"
        raise WideError(f"the `wide` section describes {got} layers, config.json has {cfg.num_layers}", HINT)
    for i, entry in enumerate(layers):
        if not isinstance(entry, dict):
            raise WideError(f"the `wide` section's layer {i} is not an object", HINT)
        r = cfg.routing[i]
        for kind, width, unit in (("attention", cfg.num_attention_heads, "attention heads"),
                                  ("ffn", cfg.intermediate_size, "FFN channels")):
            spec = entry.get(kind)
            if spec is None:
                continue
            where = f"the `wide` section's layer {i} {kind}"
            if not isinstance(spec, dict):
                raise WideError(f"{where} is not an object", HINT)
            groups, rank = _int(spec.get("groups"), f"{where} groups"), _int(spec.get("rank"), f"{where} rank")
            if rank > cfg.hidden_size:  # the compressor maps the hidden size down to the rank
                raise WideError(f"{where} rank is {rank}, more than the hidden size {cfg.hidden_size}", HINT)
            if width % groups:
                raise WideError(f"{where}: {groups} groups do not divide the {width} {unit}", HINT)
            if kind == "attention":
                r.attn_groups, r.attn_rank = groups, rank
            else:
                r.ffn_groups, r.ffn_rank = groups, rank
    lora = section.get("lora")
    if lora is not None:
        from wide_export.checkpoint.lora import check_lora_scale

        if not isinstance(lora, dict):
            raise WideError("the `wide` section's lora is not an object", HINT)
        check_lora_scale(lora.get("scale"), "the `wide` section's lora scale", HINT)
    return cfg


def check_world(cfg, tp: int) -> None:
    """Refuse a tensor-parallel size that would split a head group or an FFN group (tp/plan.py's rule)."""
    from wide_export.tp.plan import check_tp

    try:
        check_tp(cfg, tp)
    except WideError as err:
        raise WideError(str(err.message).replace("--tp", "tensor_parallel_size"),
                        f"this WIDE model runs at tensor_parallel_size {', '.join(map(str, tp_sizes(cfg)))}") from None
