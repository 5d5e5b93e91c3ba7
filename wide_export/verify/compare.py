"""Run a Polygraphy runner over the reference steps and compare: errors and router decisions."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wide_export.base.signals import check_interrupted
from wide_export.verify.reference import Step
from wide_export.verify.tolerances import Tolerance


@dataclass
class OutputRow:
    name: str
    max_abs: float
    max_rel: float
    mean_abs: float
    passed: bool


@dataclass
class DecisionRow:
    mask: str
    decisions: int
    skipped: float  # fraction of groups the reference skips (the sparsity)
    agreement: float
    flips: int
    unexplained_flips: int  # flips whose reference margin exceeds the tolerance, not caused upstream
    passed: bool
    caused_upstream: int = 0  # FFN flips beyond the margin on a token whose attention decision flipped


@dataclass
class VerifyReport:
    target: str
    dtype: str
    tolerance: dict[str, Any]
    settings: dict[str, Any]
    outputs: list[OutputRow] = field(default_factory=list)
    decisions: list[DecisionRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.outputs) and all(r.passed for r in self.decisions)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def write(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def run_steps(runner, steps: list[Step], num_layers: int) -> list[dict[str, np.ndarray]]:
    """Feed each step to `runner` (a Polygraphy runner); the past is the runner's own previous present."""
    outs = []
    with runner:
        for k, step in enumerate(steps):
            feed = dict(step.feed)
            if k:
                for i in range(num_layers):
                    for kv in ("key", "value"):
                        feed[f"past_key_values.{i}.{kv}"] = outs[-1][f"present.{i}.{kv}"]
            outs.append({name: np.asarray(v) for name, v in runner.infer(feed).items()})
            check_interrupted()  # a Ctrl-C swallowed in a finalizer stops here, not at the end
    return outs


def simple_compare_func(tol: Tolerance):
    """Polygraphy's atol/rtol comparator for `tol`.

    `SimpleCompareFunc` is the class that replaces the `CompareFunc.simple` factory
    (deprecated in Polygraphy 0.53, removed in 0.60); releases without the class only
    have the factory.
    """
    from polygraphy import comparator

    kwargs = dict(atol=tol.atol, rtol=tol.rtol, check_error_stat=tol.stat)
    cls = getattr(comparator, "SimpleCompareFunc", None)
    if cls is None:  # an older Polygraphy: the factory is not deprecated there
        return comparator.CompareFunc.simple(**kwargs)
    return cls(**kwargs)


def compare(steps: list[Step], outs: list[dict[str, np.ndarray]], tol: Tolerance, report: VerifyReport,
            runner_name: str) -> VerifyReport:
    """Fill `report` with Polygraphy's per-output errors and the per-router decision agreement."""
    from polygraphy.comparator import Comparator, IterationResult, RunResults

    float_names = [n for n in steps[0].ref if not n.startswith("/")]
    missing = [n for n in float_names if n not in outs[0]]
    if missing:
        raise RuntimeError(f"{runner_name} did not produce {missing[:3]}")
    results = RunResults()
    results.append(("pytorch", [IterationResult({n: s.ref[n] for n in float_names}, runner_name="pytorch")
                                for s in steps]))
    results.append((runner_name, [IterationResult({n: o[n].astype(np.float32) for n in float_names},
                                                  runner_name=runner_name) for o in outs]))
    func = simple_compare_func(tol)
    acc = Comparator.compare_accuracy(results, compare_func=func)
    per_iter = acc[0][("pytorch", runner_name)]  # AccuracyResults: one AccuracyResult per compare func
    for name in float_names:
        rows = [it[name] for it in per_iter]
        report.outputs.append(OutputRow(
            name, max(float(r.max_absdiff) for r in rows), max(float(r.max_reldiff) for r in rows),
            float(np.mean([float(r.mean_absdiff) for r in rows])), all(bool(r) for r in rows)))
    mask_names = [n for n in steps[0].ref if n.startswith("/")]
    if mask_names and mask_names[0] not in outs[0]:
        report.notes.append(f"{runner_name} exposes no router masks: decision agreement not measured")
        return report
    for name in mask_names:
        ref = np.concatenate([s.ref[name].ravel() for s in steps])
        flips = np.concatenate([_flips(s, o, name).ravel() for s, o in zip(steps, outs)])
        margin = np.concatenate([np.abs(s.margins[name]).ravel() for s in steps])
        upstream = np.concatenate([_attention_flipped(s, o, name).ravel() for s, o in zip(steps, outs)])
        beyond = flips & (margin > tol.flip_margin)
        unexplained = int(np.sum(beyond & ~upstream))
        agreement = float(1.0 - flips.mean())
        report.decisions.append(DecisionRow(name, int(ref.size), float(1.0 - ref.mean()), agreement,
                                            int(flips.sum()), unexplained,
                                            agreement >= tol.min_agreement and unexplained == 0,
                                            int(np.sum(beyond & upstream))))
    return report


def _flips(step: Step, out: dict, name: str) -> np.ndarray:
    return step.ref[name] != out[name].astype(np.int32)


def _attention_flipped(step: Step, out: dict, name: str) -> np.ndarray:
    """For an FFN router's mask [B, T, G]: True on tokens whose attention decision in the same layer
    flipped. That flip changes the token's attention output, so the FFN router sees another input there
    and its own flips on that token say nothing about precision. False elsewhere (and for attention)."""
    attention = name.replace("/router_ffn/", "/router_attention/")
    if attention == name or attention not in step.ref or attention not in out:
        return np.zeros(step.ref[name].shape, dtype=bool)
    token = _flips(step, out, attention).any(axis=-1, keepdims=True)
    return np.broadcast_to(token, step.ref[name].shape)


def print_report(report: VerifyReport) -> None:
    """Two rich tables (outputs, router decisions) and a verdict line."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, highlight=False)
    t = Table(title=f"{report.target} vs PyTorch reference ({report.dtype})", title_justify="left")
    for col in ("output", "max |abs|", "max rel", "mean |abs|", "ok"):
        t.add_column(col, justify="left" if col == "output" else "right")
    for r in _grouped_outputs(report.outputs):
        t.add_row(r.name, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}", f"{r.mean_abs:.2e}", _ok(r.passed))
    console.print(t)
    if report.decisions:
        d = Table(title="router decisions", title_justify="left")
        for col in ("router", "decisions", "skipped", "agreement", "flips", "unexplained", "ok"):
            d.add_column(col, justify="left" if col == "router" else "right")
        for r in report.decisions:
            d.add_row(_short(r.mask), str(r.decisions), f"{100 * r.skipped:.0f} %", f"{100 * r.agreement:.2f} %",
                      str(r.flips), str(r.unexplained_flips), _ok(r.passed))
        console.print(d)
    upstream = sum(r.caused_upstream for r in report.decisions)
    if upstream:
        console.print(f"note: {upstream} FFN router flip(s) beyond the margin are on tokens whose attention "
                      "decision in the same layer flipped (that changes the FFN router's input): not counted "
                      "as unexplained")
    for n in report.notes:
        console.print(f"note: {n}")
    tol = report.tolerance
    console.print(f"tolerances: atol {tol['atol']}, rtol {tol['rtol']} ({tol['stat']}); decisions >= "
                  f"{100 * tol['min_agreement']:.1f} % agree, no flip with margin > {tol['flip_margin']}")
    console.print("[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]")


def _grouped_outputs(rows: list[OutputRow]) -> list[OutputRow]:
    """logits, then presents (one row per key/value) and layer outputs folded over layers (worst layer)."""
    out = [r for r in rows if not r.name.startswith(("present.", "layer_output."))]
    for prefix, kv in (("present.", "key"), ("present.", "value"), ("layer_output.", "")):
        group = [r for r in rows if r.name.startswith(prefix) and r.name.endswith(kv)]
        if group:
            label = f"{prefix}*.{kv}" if kv else f"{prefix}*"
            out.append(OutputRow(f"{label} ({len(group)} layers)", max(r.max_abs for r in group),
                                 max(r.max_rel for r in group), float(np.mean([r.mean_abs for r in group])),
                                 all(r.passed for r in group)))
    return out


def _short(mask_name: str) -> str:
    """'/model/layers.3/router_ffn/mask' -> 'L3 ffn', '.../router_attention/mask' -> 'L3 attn'."""
    parts = mask_name.strip("/").split("/")
    if len(parts) < 3:
        return mask_name
    kind = parts[2].removeprefix("router_").replace("attention", "attn")
    return f"L{parts[1].split('.')[-1]} {kind}"


def _ok(passed: bool) -> str:
    return "[green]yes[/]" if passed else "[red]NO[/]"
