"""`wide-export analyze` output: a rich table, analyze.json and a layers x sparsity plot."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path


def _cell(s) -> str:
    return "dense" if s is None else f"{s.mean:.1%} ± {s.std:.1%}"


def table(report):
    from rich.table import Table

    t = Table(title=f"realized sparsity per layer ({report.tokens} tokens, {report.windows} window(s) of "
                    f"<= {report.window}); mean ± std across tokens")
    for col in ("layer", "attention", "attn p10-p90", "ffn", "ffn p10-p90"):
        t.add_column(col, justify="right", no_wrap=True)
    phases = list(report.predicted_total)
    for p in phases:
        t.add_column(f"pred. {p}", justify="right", no_wrap=True)
    span = lambda s: "" if s is None else f"{s.p10:.0%}-{s.p90:.0%}"  # noqa: E731
    for r in report.layers:
        t.add_row(str(r.layer), _cell(r.attention), span(r.attention), _cell(r.ffn), span(r.ffn),
                  *[f"{r.predicted[p]:.2f}x" for p in phases])
    if phases:
        t.add_row("total", "", "", "", "", *[f"{report.predicted_total[p]:.2f}x" for p in phases], style="bold")
    return t


def summary_lines(report) -> list[str]:
    delta = report.ppl_wide / report.ppl_dense - 1
    lines = [f"perplexity: dense {report.ppl_dense:.3f} (routers forced on), WIDE {report.ppl_wide:.3f} "
             f"({delta:+.1%})"]
    if report.onnx:
        o = report.onnx
        worst = min(o["agreement"].items(), key=lambda kv: kv[1]) if o["agreement"] else ("-", 1.0)
        mean = sum(o["agreement"].values()) / max(1, len(o["agreement"]))
        lines.append(f"ONNX export ({o['dtype']}, onnxruntime): perplexity {o['ppl']:.3f} "
                     f"({o['ppl'] / report.ppl_wide - 1:+.2%} vs the reference); router agreement "
                     f"{mean:.2%} on average, lowest {worst[1]:.2%} (layer {worst[0]})")
    if report.prediction_basis:
        lines.append(f"predicted speed-up: {report.prediction_basis}")
    return lines


def write_json(report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(report), indent=2))
    tmp.replace(path)


def write_plot(report, path: Path) -> bool:
    """Sparsity (mean, error bar = std, band = p10-p90) per layer; predicted speed-up on a second axis."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(report.layers) + 3), 4.2), layout="constrained")
    for kind, color, dx in (("attention", "tab:blue", -0.1), ("ffn", "tab:orange", 0.1)):
        pts = [(r.layer, getattr(r, kind)) for r in report.layers if getattr(r, kind) is not None]
        if not pts:
            continue
        xs = [x + dx for x, _ in pts]
        ax.errorbar(xs, [s.mean for _, s in pts], yerr=[s.std for _, s in pts], fmt="o-", color=color,
                    capsize=3, label=f"{kind} (mean ± std)")
        ax.fill_between(xs, [s.p10 for _, s in pts], [s.p90 for _, s in pts], color=color, alpha=0.15)
    ax.set_xticks([r.layer for r in report.layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of groups skipped")
    ax.set_ylim(-0.02, 1.02)
    handles, labels = ax.get_legend_handles_labels()
    if report.predicted_total:
        ax2 = ax.twinx()
        for phase, style in zip(report.predicted_total, ("s--", "^:")):
            ax2.plot([r.layer for r in report.layers], [r.predicted[phase] for r in report.layers], style,
                     color="gray", label=f"predicted {phase} speed-up")
        ax2.set_ylabel("predicted speed-up (x)")
        more = ax2.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    ax.set_title(f"WIDE realized sparsity; ppl dense {report.ppl_dense:.2f} vs WIDE {report.ppl_wide:.2f}",
                 fontsize=10)
    # One legend below the axes, outside the data: inside, it covered the predicted decode line.
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
