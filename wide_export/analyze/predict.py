"""Predicted speed-up per layer from a kernel benchmark's JSON (`wide-export bench kernels`).

Model of a layer's cost: its projection GEMMs only (attention core, norms and
the LM head are left out), each weighted by its FLOPs (N x K) in this model.
A masked projection runs `speedup` times faster than its dense GEMM, where
`speedup` is the benchmark's measurement for the same kernel (q: gemm_n, o and
down: gemm_k, gate+up: gated), the nearest group size and token count (log
scale), the nearest shape, random masks, interpolated linearly in sparsity at
the sparsity this text realized (clamped to the measured range). k and v stay
dense (speed-up 1). Layer: sum(w) / sum(w / speedup); total likewise over layers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from wide_export.base.errors import WideError

PHASES = {"prefill": None, "decode": 1}  # tokens per GEMM: the window (prefill) or one (decode)


def load_rows(path: Path) -> list[dict]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        rows = data["rows"]
        need = {"kernel", "N", "K", "group_size", "sparsity", "mask", "tokens", "speedup"}
        if not rows or not all(need <= set(r) for r in rows):
            raise KeyError("rows")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WideError(f"{path} is not a kernel benchmark's JSON ({type(err).__name__}: {err})",
                        "pass the kernels.json written by `wide-export bench kernels`") from None
    device, arch = str(data.get("device", "")), str(data.get("arch", ""))
    if arch == "interpreter" or "interpreter" in device or device.startswith("cpu"):
        raise WideError(f"{path} holds CPU timings ({device or arch}, the Triton interpreter): they say nothing "
                        "about GPU speed, so no speed-up is predicted from them",
                        "pass a kernels.json from `wide-export bench kernels` on the GPU you deploy to, or leave "
                        "--kernels-json out")
    random = [r for r in rows if r["mask"] == "random"]
    return random or rows


def _nearest(values, target: float) -> float:
    return min(values, key=lambda v: (abs(math.log2(v / target)), v))


def lookup(rows: list[dict], kernel: str, N: int, K: int, group_size: int, tokens: int, sparsity: float) -> float:
    """The benchmark's speed-up for this projection (see the module docstring for 'nearest')."""
    sel = [r for r in rows if r["kernel"] == kernel]
    if not sel:
        raise WideError(f"the kernel benchmark has no {kernel!r} rows", "pass a complete kernels.json")
    gs = _nearest({r["group_size"] for r in sel}, group_size)
    sel = [r for r in sel if r["group_size"] == gs]
    t = _nearest({r["tokens"] for r in sel}, tokens)
    sel = [r for r in sel if r["tokens"] == t]
    size = _nearest({r["N"] * r["K"] for r in sel}, N * K)
    pts = sorted((r["sparsity"], r["speedup"]) for r in sel if r["N"] * r["K"] == size)
    if sparsity <= pts[0][0]:
        return pts[0][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if sparsity <= s1:
            return v0 + (v1 - v0) * (sparsity - s0) / (s1 - s0) if s1 > s0 else v1
    return pts[-1][1]


def layer_terms(cfg, layer: int, stats, tokens: int, rows: list[dict]) -> list[tuple[float, float]]:
    """(FLOP weight, speed-up) of each projection of one layer."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    q_width, kv_width = cfg.num_attention_heads * cfg.head_dim, 2 * cfg.num_key_value_heads * cfg.head_dim
    terms = [(kv_width * H, 1.0)]
    a, f = stats.attention, stats.ffn
    if a is None:
        terms += [(q_width * H, 1.0), (H * q_width, 1.0)]
    else:
        gs = a.group_size * cfg.head_dim
        terms += [(q_width * H, lookup(rows, "n", q_width, H, gs, tokens, a.mean)),
                  (H * q_width, lookup(rows, "k", H, q_width, gs, tokens, a.mean))]
    if f is None:
        terms += [(2 * I * H, 1.0), (H * I, 1.0)]
    else:
        terms += [(2 * I * H, lookup(rows, "gated", I, H, f.group_size, tokens, f.mean)),
                  (H * I, lookup(rows, "k", H, I, f.group_size, tokens, f.mean))]
    return terms


def _combine(terms) -> float:
    return sum(w for w, _ in terms) / sum(w / s for w, s in terms)


def predict(report, cfg, rows: list[dict], source: str) -> None:
    """Fill report.layers[i].predicted and report.predicted_total for prefill (window tokens) and decode."""
    for phase, tokens in PHASES.items():
        tokens = tokens or report.window
        everything = []
        for stats in report.layers:
            terms = layer_terms(cfg, stats.layer, stats, tokens, rows)
            stats.predicted[phase] = _combine(terms)
            everything += terms
        report.predicted_total[phase] = _combine(everything)
    report.prediction_basis = (f"{source}: projection GEMMs only, FLOP-weighted; prefill at "
                               f"{report.window} tokens, decode at 1 (nearest measured)")
