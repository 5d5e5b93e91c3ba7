"""What each tensor-parallel rank holds: query-head groups aligned to its KV heads, FFN groups by placement.

Rank r of N holds KV heads [r*kv/N, (r+1)*kv/N), the query heads that attend to them and so the attention
groups [r*Ga/N, (r+1)*Ga/N) (a group of ATTN_G heads never straddles two ranks). In the FFN it holds
Gf/N channel groups: the groups `ffn_order[layer][r*Gf/N:(r+1)*Gf/N]`, where ffn_order is a permutation of
the groups (identity, or balance.py's placement). Routers, norms, embeddings and lm_head are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wide_export.errors import WideError

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


def check_tp(cfg, tp: int) -> None:
    """Refuse (one line) a world size the model's heads or groups do not divide by."""
    hint = "choose --tp dividing num_key_value_heads, the attention groups and the FFN groups"
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
