"""What each tensor-parallel rank holds: query-head groups aligned to its KV heads, FFN groups by placement.

Rank r of N holds KV heads [r*kv/N, (r+1)*kv/N), the query heads that attend to them and so the attention
groups [r*Ga/N, (r+1)*Ga/N) (a group of ATTN_G heads never straddles two ranks). In the FFN it holds
Gf/N channel groups: the groups `ffn_order[layer][r*Gf/N:(r+1)*Gf/N]`, where ffn_order is a permutation of
the groups (identity, or balance.py's placement). Routers, norms, embeddings and lm_head are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wide_export.base.errors import WideError

MANIFEST = "tp_manifest.json"
FORMAT = "wide-export/onnx-tp"


def rank_dir(r: int) -> str:
    return f"rank{r}"


@dataclass
class TPPlan:
    tp: int
    ffn_order: list[list[int] | None] = field(default_factory=list)  # per layer: group permutation (None: dense)
    placement: str = "identity"  # identity | balanced

    def ffn_groups(self, layer: int, rank: int) -> list[int] | None:
        order = self.ffn_order[layer]
        if order is None:
            return None
        k = len(order) // self.tp
        return order[rank * k:(rank + 1) * k]


HINT = "choose --tp dividing num_key_value_heads, the attention groups and the FFN groups"


def check_tp_sizes(tp: int, num_key_value_heads: int, intermediate_size: int) -> None:
    """The part of check_tp that config.json alone decides: refused before any router or weight is read."""
    if tp < 1:
        raise WideError(f"--tp {tp} is not a world size", "pass --tp N with N >= 1")
    if num_key_value_heads % tp:
        raise WideError(f"--tp {tp} does not divide num_key_value_heads={num_key_value_heads}", HINT)
    if intermediate_size % tp:
        raise WideError(f"--tp {tp} does not divide intermediate_size={intermediate_size}", HINT)


def check_tp_early(model_dir, tp: int) -> None:
    """check_tp_sizes from config.json (or the demo's spec) without torch or transformers: `--tp 3` on a
    model with 8 KV heads is refused in the time it takes to read a JSON file. A config.json that cannot be
    read is left to the loader, which reports it."""
    from pathlib import Path

    if model_dir is None:
        from wide_export.model.demo import DEMO_SPEC

        check_tp_sizes(tp, DEMO_SPEC.num_kv_heads, DEMO_SPEC.intermediate_size)
        return
    from wide_export.base.paths import read_json

    path = Path(model_dir) / "config.json"
    try:
        from wide_export.base.paths import confined

        confined(path, Path(model_dir), "config file")
        raw = read_json(path)
    except (WideError, OSError):
        return
    if not isinstance(raw, dict):
        return
    heads, kv, inter = (raw.get(k) for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"))
    kv = kv if kv is not None else heads
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (kv, inter)):
        check_tp_sizes(tp, kv, inter)


def check_tp(cfg, tp: int) -> None:
    """Refuse (one line) a world size the model's heads or groups do not divide by."""
    hint = HINT
    if tp < 1:
        raise WideError(f"--tp {tp} is not a world size", "pass --tp N with N >= 1")
    if cfg.num_key_value_heads % tp:
        raise WideError(f"--tp {tp} does not divide num_key_value_heads={cfg.num_key_value_heads}", hint)
    for i, r in enumerate(cfg.routing):
        if r.attn_groups is not None and r.attn_groups % tp:
            raise WideError(f"--tp {tp} does not divide layer {i}'s {r.attn_groups} attention groups", hint)
        if r.ffn_groups is not None and r.ffn_groups % tp:
            raise WideError(f"--tp {tp} does not divide layer {i}'s {r.ffn_groups} FFN groups", hint)
    if cfg.intermediate_size % tp:
        raise WideError(f"--tp {tp} does not divide intermediate_size={cfg.intermediate_size}", hint)
    # kv % tp == 0 and heads % kv == 0 give heads % tp == 0; an attention group lies inside one rank when the
    # groups divide by tp (group g holds heads [g*ATTN_G, (g+1)*ATTN_G), rank r heads [r*Hq/N, (r+1)*Hq/N)).


def identity_plan(cfg, tp: int) -> TPPlan:
    check_tp(cfg, tp)
    return TPPlan(tp, [None if r.ffn_groups is None else list(range(r.ffn_groups)) for r in cfg.routing])


def rank_config(cfg, tp: int):
    """The dimensions one rank's graph has (heads, KV heads, FFN channels divided by tp; routers whole)."""
    import dataclasses

    return dataclasses.replace(cfg, num_attention_heads=cfg.num_attention_heads // tp,
                               num_key_value_heads=cfg.num_key_value_heads // tp,
                               intermediate_size=cfg.intermediate_size // tp,
                               routing=[dataclasses.replace(r) for r in cfg.routing])


def head_range(cfg, tp: int, rank: int) -> tuple[int, int]:
    n = cfg.num_attention_heads // tp
    return rank * n, (rank + 1) * n


def kv_range(cfg, tp: int, rank: int) -> tuple[int, int]:
    n = cfg.num_key_value_heads // tp
    return rank * n, (rank + 1) * n


def attn_group_range(cfg, layer: int, tp: int, rank: int) -> tuple[int, int] | None:
    g = cfg.routing[layer].attn_groups
    if g is None:
        return None
    n = g // tp
    return rank * n, (rank + 1) * n


def ffn_channels(cfg, plan: TPPlan, layer: int, rank: int) -> list[int]:
    """Global FFN channel indices rank `rank` holds, in its local order."""
    groups = plan.ffn_groups(layer, rank)
    if groups is None:  # dense FFN: a contiguous slice
        n = cfg.intermediate_size // plan.tp
        return list(range(rank * n, (rank + 1) * n))
    gs = cfg.ffn_group_size(layer)
    return [g * gs + c for g in groups for c in range(gs)]
