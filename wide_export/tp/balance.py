"""Balanced FFN placement across tensor-parallel ranks, from routing statistics measured on text.

WIDE's FFN groups are not equally busy: group g executes for a fraction p_g of the tokens. With row-parallel
FFN shards each layer ends in an all-reduce, so a layer takes as long as its busiest rank, whose expected
work per token is the sum of p_g * FFN_G over the groups it holds. FFN groups may be permuted freely (gate/up
rows, down columns and the router's logit pairs together: the model computes the same function), so we
choose which Gf/N groups each rank holds to make the expected work per rank equal.

Load of a rank (a number per layer): expected active FFN channels per token on that rank, divided by the
channels a rank holds (1.0 = every channel of the rank runs for every token). The slowest-rank load of a
model is the mean over layers of the per-layer maximum over ranks (the pace the all-reduces impose); the
ideal is the mean over layers of the per-layer mean over ranks.

Placement: greedy (largest p_g first, onto the least-loaded rank that still has room), then pairwise swaps
between the busiest rank and the others while they lower its load; a layer keeps the identity placement
unless this strictly lowers its maximum, so the predicted maximum never increases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError


def rank_loads(rates: list[float], order: list[int], tp: int) -> list[float]:
    """Per-rank load (see the module docstring) of one layer whose graph group j is checkpoint group order[j]."""
    k = len(order) // tp
    return [sum(rates[g] for g in order[r * k:(r + 1) * k]) / k for r in range(tp)]


def balanced_order(rates: list[float], tp: int) -> list[int]:
    """A group order whose slowest rank is no busier than the identity's (lower when the rates allow)."""
    g = len(rates)
    k = g // tp
    bins: list[list[int]] = [[] for _ in range(tp)]
    sums = [0.0] * tp
    for grp in sorted(range(g), key=lambda x: (-rates[x], x)):
        r = min((r for r in range(tp) if len(bins[r]) < k), key=lambda r: (sums[r], r))
        bins[r].append(grp)
        sums[r] += rates[grp]
    improved = True
    while improved:  # swap a group of the busiest rank with a lighter one of another rank
        improved = False
        hi = max(range(tp), key=lambda r: sums[r])
        best = None
        for r in range(tp):
            if r == hi:
                continue
            for a in bins[hi]:
                for b in bins[r]:
                    d = rates[a] - rates[b]
                    if d > 1e-12 and max(sums[hi] - d, sums[r] + d) < sums[hi] - 1e-12:
                        if best is None or d < best[0]:
                            best = (d, r, a, b)
        if best:
            d, r, a, b = best
            bins[hi][bins[hi].index(a)] = b
            bins[r][bins[r].index(b)] = a
            sums[hi] -= d
            sums[r] += d
            improved = True
    order = [x for b in bins for x in sorted(b)]
    identity = list(range(g))
    if max(rank_loads(rates, order, tp)) < max(rank_loads(rates, identity, tp)) - 1e-12:
        return order
    return identity


@dataclass
class Balance:
    """Predicted per-rank FFN loads before (identity) and after (balanced) placement."""

    tp: int
    tokens: int
    text: str
    layers: list[dict] = field(default_factory=list)  # {layer, before: [..], after: [..], order: [..]}
    attention: list[dict] = field(default_factory=list)  # {layer, loads: [..]}: heads are fixed to KV heads

    def summary(self) -> dict:
        ffn = [lay for lay in self.layers]
        if not ffn:
            return {"tp": self.tp, "tokens": self.tokens, "ffn_layers": 0}
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        return {"tp": self.tp, "tokens": self.tokens, "text": self.text, "ffn_layers": len(ffn),
                "slowest_rank_load_before": mean([max(lay["before"]) for lay in ffn]),
                "slowest_rank_load_after": mean([max(lay["after"]) for lay in ffn]),
                "ideal_load": mean([mean(lay["before"]) for lay in ffn])}

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "layers": self.layers, "attention": self.attention}

    def lines(self) -> list[str]:
        s = self.summary()
        if not s["ffn_layers"]:
            return [f"tp {self.tp}: no routed FFN layer, nothing to balance"]
        b, a, i = s["slowest_rank_load_before"], s["slowest_rank_load_after"], s["ideal_load"]
        return [f"tp {self.tp}: predicted slowest-rank FFN load (mean over {s['ffn_layers']} routed layers of the "
                f"busiest rank's expected active fraction, {self.tokens} tokens of {Path(self.text).name}): "
                f"identity placement {b:.4f}, balanced {a:.4f} ({a / b - 1:+.2%}); ideal {i:.4f}"]


def from_rates(rates: dict[tuple[int, str], list[float]], cfg, tp: int, tokens: int, text: str) -> Balance:
    from wide_export.tp.plan import check_tp

    check_tp(cfg, tp)
    out = Balance(tp, tokens, str(text))
    for i in range(cfg.num_layers):
        if (i, "ffn") in rates:
            p = rates[i, "ffn"]
            order = balanced_order(p, tp)
            out.layers.append({"layer": i, "before": rank_loads(p, list(range(len(p))), tp),
                               "after": rank_loads(p, order, tp), "order": order})
        if (i, "attention") in rates:
            p = rates[i, "attention"]
            out.attention.append({"layer": i, "loads": rank_loads(p, list(range(len(p))), tp)})
    return out


def measure_rates(model, encode, text: str, window: int = 512,
                  progress: Optional[Callable[[str], None]] = None) -> tuple[dict, int]:
    """{(layer, kind): [fraction of tokens executing group g]} of the reference model over the text."""
    import torch

    from wide_export.checkpoint.text import windows
    from wide_export.model.modeling import Collector

    ids = encode(text)
    window = min(window, model.config.max_position_embeddings)
    chunks = windows(ids, window)
    if not chunks:
        raise WideError(f"the balance text gives {len(ids)} token(s), too few to measure routing",
                        "pass a longer --balance-text (a few paragraphs at least)")
    if max(ids) >= model.config.vocab_size:
        raise WideError(f"the tokenizer produced id {max(ids)}, the model's vocabulary has "
                        f"{model.config.vocab_size} entries", "the folder's tokenizer does not belong to this model")
    sums: dict[tuple[int, str], torch.Tensor] = {}
    n = 0
    with torch.no_grad():
        for k, chunk in enumerate(chunks):
            if progress:
                progress(f"routing statistics: window {k + 1}/{len(chunks)}")
            x = torch.tensor([chunk])
            collect = Collector()
            model(x, torch.ones_like(x), torch.arange(x.shape[1])[None], model.empty_cache(1), collect=collect)
            for i, masks in enumerate(collect.masks):
                for kind, m in masks.items():
                    s = m[0].double().sum(0)
                    sums[i, kind] = s if (i, kind) not in sums else sums[i, kind] + s
            n += len(chunk)
    return {key: (v / n).tolist() for key, v in sums.items()}, n


def balance_from_text(model_dir: Path, text_path: Path, cfg, model, tp: int, window: int = 512,
                      progress=None) -> Balance:
    """Measure routing on the text (the model folder's tokenizer) and place the FFN groups."""
    from wide_export.checkpoint.text import load_tokenizer, read_text

    text = read_text(text_path)
    encode = load_tokenizer(model_dir)
    rates, tokens = measure_rates(model, encode, text, window, progress)
    return from_rates(rates, cfg, tp, tokens, str(text_path))


def print_tp(console, tp: dict) -> None:
    """The per-layer table of a Balance.to_dict() and its summary line (analyze --tp)."""
    from rich.table import Table

    s = tp["summary"]
    if not s.get("ffn_layers"):
        console.print(f"tp {s['tp']}: no routed FFN layer, nothing to balance")
        return
    t = Table(title=f"tensor parallelism {s['tp']}: expected active fraction of each rank's FFN channels "
                    f"({s['tokens']} tokens)")
    for col in ("layer", "identity: per rank", "max", "balanced: per rank", "max"):
        t.add_column(col, justify="right")
    for lay in tp["layers"]:
        t.add_row(str(lay["layer"]), " ".join(f"{x:.3f}" for x in lay["before"]), f"{max(lay['before']):.3f}",
                  " ".join(f"{x:.3f}" for x in lay["after"]), f"{max(lay['after']):.3f}")
    console.print(t)
    b, a, i = s["slowest_rank_load_before"], s["slowest_rank_load_after"], s["ideal_load"]
    console.print(f"predicted slowest-rank FFN load: identity {b:.4f}, balanced {a:.4f} ({a / b - 1:+.2%}), "
                  f"ideal {i:.4f} (attention heads stay with their KV heads: not rebalanced)")
