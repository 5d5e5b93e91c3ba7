"""`wide-export bench kernels --device cpu`: the CPU kernels (wide_export.cpu) against the dense GEMM they
replace, on the same weights in one run: milliseconds, the weight bytes each reads, GB/s and the fraction of
this machine's measured copy bandwidth, and the policy these timings support (which path serves which token
count), as data for wide_export/cpu/policy.json.

The dense side is what a model without WIDE runs: torch's F.linear (oneDNN / MKL on CPU), gate and up as two
GEMMs with SiLU-and-mul. The K-pruned kernels (o, down) read their weights packed per input group (ops.pack_k),
the layout a WIDE model keeps them in. Weights rotate through copies that together exceed the last-level cache twice
(this machine's L3 is read from sysfs), so a call reads its weights from memory as a model's decode step does."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.bench.common import CPU_DTYPES, pyplot, read_record
from wide_export.base.errors import WideError

KINDS = ("n", "gated", "k")


@dataclass(frozen=True)
class CpuPreset:
    shapes: tuple  # (name, N, K, kind, group_size)
    tokens: tuple
    sparsities: tuple
    reps: int
    masked_max_tokens: int  # larger token counts time the dense path only (the masked one is far behind there)


LLAMA_8B = (("q", 4096, 4096, "n", 512), ("o", 4096, 4096, "k", 512), ("gate_up", 14336, 4096, "gated", 128),
            ("down", 4096, 14336, "k", 128))
PRESETS = {
    "short": CpuPreset(LLAMA_8B, tokens=(1, 2, 4, 8, 16, 64, 512), sparsities=(0.0, 0.5), reps=8,
                       masked_max_tokens=64),
    "full": CpuPreset(LLAMA_8B, tokens=(1, 2, 4, 8, 16, 32, 64, 128, 512), sparsities=(0.0, 0.25, 0.5, 0.75),
                      reps=12, masked_max_tokens=128),
    # the 0.37 B Llama the generation and vLLM benchmarks run (bench/common.MODEL_PRESETS)
    "llama-0.4b": CpuPreset((("q", 2048, 2048, "n", 256), ("o", 2048, 2048, "k", 256),
                             ("gate_up", 8192, 2048, "gated", 128), ("down", 2048, 8192, "k", 128)),
                            tokens=(1, 2, 4, 8, 16, 32, 64, 512), sparsities=(0.0, 0.5), reps=10,
                            masked_max_tokens=64),
    "tiny": CpuPreset((("q", 256, 192, "n", 32), ("gate_up", 384, 192, "gated", 32), ("down", 192, 384, "k", 32)),
                      tokens=(1, 4), sparsities=(0.0, 0.5), reps=2, masked_max_tokens=4),
}
DTYPES = CPU_DTYPES


@dataclass
class CpuRow:
    shape: str
    kind: str
    dtype: str
    N: int
    K: int
    group_size: int
    tokens: int
    sparsity: float
    union: float               # fraction of groups some token of the call executes
    dense_ms: float
    masked_ms: Optional[float]  # None: not timed (tokens above the preset's masked_max_tokens)
    auto_path: str              # what the policy in use picks for this call
    weight_bytes: int           # dense: every weight byte
    masked_bytes: int           # the executed groups' weight bytes (read once per call)
    speedup: Optional[float] = None          # dense_ms / masked_ms
    masked_gbs: Optional[float] = None
    dense_gbs: float = 0.0
    masked_pct_of_copy: Optional[float] = None
    dense_pct_of_copy: float = 0.0


@dataclass
class CpuReport:
    cpu: str
    isa: str
    threads: int
    preset: str
    copy_bandwidth_gbs: float
    l3_bytes: int
    rows: list = field(default_factory=list)
    measured_policy: dict = field(default_factory=dict)
    complete: bool = False


def l3_bytes() -> int:
    """The last-level cache's size from sysfs (0 when unknown)."""
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG")) * mult)
    return best


def _median_ms(fn: Callable[[int], object], reps: int) -> float:
    fn(0)
    times = []
    for i in range(reps):
        t = time.perf_counter()
        fn(i + 1)
        times.append(time.perf_counter() - t)
    times.sort()
    return 1e3 * times[len(times) // 2]


def copy_bandwidth_gbs(nbytes: int) -> float:
    """Read + write bytes per second of one copy of `nbytes` (above the last-level cache), GB/s."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda _: dst.copy_(src), 5)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _mask(M: int, G: int, s: float, gen):
    """Every token skips exactly round(G * s) groups, which ones at random."""
    import torch

    k = round(G * s)
    order = torch.rand(M, G, generator=gen).argsort(dim=1)
    keep = torch.ones(M, G, dtype=torch.int32)
    keep.scatter_(1, order[:, :k], 0)
    return keep


def run_cpu_bench(preset: str = "short", dtypes=("fp32", "bf16"), seed: int = 0,
                  progress: Optional[Callable[[str], None]] = None,
                  on_row: Optional[Callable[[CpuReport], None]] = None) -> CpuReport:
    import torch
    import torch.nn.functional as F

    from wide_export.cpu import ops

    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", hint=f"choose one of {sorted(PRESETS)}")
    for d in dtypes:
        if d not in DTYPES:
            raise WideError(f"unknown dtype {d!r} for the CPU kernels", hint=", ".join(DTYPES))
    ops.require(", so there is nothing to compare")
    cfg = PRESETS[preset]
    say = progress or (lambda _m: None)
    l3 = l3_bytes()
    say("measuring copy bandwidth")
    report = CpuReport(cpu=ops.cpu_model(), isa=ops.isa(), threads=torch.get_num_threads(), preset=preset,
                       copy_bandwidth_gbs=copy_bandwidth_gbs(max(4 * l3, 1 << 28) if preset != "tiny" else 1 << 24),
                       l3_bytes=l3)
    gen = torch.Generator().manual_seed(seed)
    for dname in dtypes:
        dt = getattr(torch, DTYPES[dname])
        pol = ops.policy(DTYPES[dname])
        for name, N, K, kind, gs in cfg.shapes:
            per = N * K * dt.itemsize * (2 if kind == "gated" else 1)
            copies = 1 if preset == "tiny" else max(2, math.ceil(2 * l3 / per))
            say(f"{dname} {name}: {copies} weight copies ({copies * per / 2**30:.1f} GiB)")
            ws = [torch.empty(N, K, dtype=dt).normal_(0, 0.02, generator=gen) for _ in range(copies)]
            us = [torch.empty(N, K, dtype=dt).normal_(0, 0.02, generator=gen) for _ in range(copies)] \
                if kind == "gated" else ws
            if kind == "k":  # the masked side reads W^T [K, N], the layout the plugin and generation keep
                us = [w.t().contiguous() for w in ws]
            G = (K if kind == "k" else N) // gs
            for T in cfg.tokens:
                x = torch.randn(T, K, generator=gen).to(dt)
                for s in cfg.sparsities:
                    say(f"{dname} {name} T={T} s={s:.0%}")
                    mask = _mask(T, G, s, gen)
                    e = ops._expand(mask, gs, dt)

                    def dense(i, x=x, e=e):
                        w, u = ws[i % copies], us[i % copies]
                        if kind == "n":
                            return F.linear(x, w) * e
                        if kind == "gated":
                            return F.silu(F.linear(x, w)) * F.linear(x, u) * e
                        return F.linear(x * e, w)

                    def masked(i, x=x, mask=mask):
                        w, u = ws[i % copies], us[i % copies]
                        if kind == "n":
                            return ops.masked_gemm_n(x, w, mask, gs, path="masked")
                        if kind == "gated":
                            return ops.masked_gated_mlp(x, w, u, mask, gs, path="masked")
                        return ops.masked_gemm_kt(x, u, mask, gs, path="masked")

                    union = float(mask.bool().any(0).float().mean())
                    d_ms = _median_ms(dense, max(cfg.reps, copies))
                    m_ms = _median_ms(masked, max(cfg.reps, copies)) if T <= cfg.masked_max_tokens else None
                    masked_bytes = int(per * union)
                    auto = ops.choose(kind, T, DTYPES[dname], lambda union=union: union)
                    row = CpuRow(name, kind, dname, N, K, gs, T, s, union, d_ms, m_ms, auto, per, masked_bytes,
                                 dense_gbs=per / d_ms / 1e6,
                                 dense_pct_of_copy=100 * per / d_ms / 1e6 / report.copy_bandwidth_gbs)
                    if m_ms is not None:
                        row.speedup = d_ms / m_ms
                        row.masked_gbs = masked_bytes / m_ms / 1e6
                        row.masked_pct_of_copy = 100 * row.masked_gbs / report.copy_bandwidth_gbs
                    report.rows.append(row)
                    if on_row:
                        on_row(report)
            del ws, us
    report.measured_policy = measured_policy(report)
    report.complete = True
    return report


def measured_policy(report: CpuReport) -> dict:
    """The policy these rows support, per dtype (wide_export/cpu/policy.json's layout): per kind, the largest
    token count up to which the masked kernel at 50 % sparsity is at least as fast as dense at every count
    (over every shape timed; one token always masked); dense where the union of the call's masks is 0.95 or
    more, except from masked_full_union_min_m to masked_full_union_max_m tokens, the first run of counts where
    the masked kernel at sparsity 0 beat dense by 3 % (per kind, every shape)."""
    out = {}
    for dname, dtype in DTYPES.items():
        rows = [r for r in report.rows if r.dtype == dname and r.masked_ms is not None]
        if not rows:
            continue
        entry = {"masked_max_m": {}, "dense_union_min": 0.95}
        for kind in KINDS:
            half = [r for r in rows if r.kind == kind and r.sparsity == 0.5]
            best = 1
            for T in sorted({r.tokens for r in half}):
                if not all(r.masked_ms <= r.dense_ms for r in half if r.tokens == T):
                    break
                best = T
            entry["masked_max_m"][kind] = best
        entry["masked_full_union_min_m"], entry["masked_full_union_max_m"] = {}, {}
        for kind in KINDS:  # the counts where the masked kernel beats dense by 3 % even at sparsity 0 (the first
            # run of them, every shape of the kind)
            counts = sorted({r.tokens for r in rows if r.kind == kind and r.sparsity == 0.0
                             and r.tokens <= entry["masked_max_m"][kind]})
            wins = [all(r.masked_ms <= 0.97 * r.dense_ms for r in rows
                        if r.kind == kind and r.sparsity == 0.0 and r.tokens == T) for T in counts]
            if True in wins:
                first = wins.index(True)
                last = first
                while last + 1 < len(wins) and wins[last + 1]:
                    last += 1
                entry["masked_full_union_min_m"][kind] = counts[first]
                entry["masked_full_union_max_m"][kind] = counts[last]
        out[dtype] = entry
    return out


def validate_entry(entry) -> list[str]:
    """What is wrong with one CPU model's policy entry ({dtype: {"masked_max_m": {kind: int}, "dense_union_min": x}})."""
    errs = []
    if not isinstance(entry, dict) or not entry:
        return ["an entry is a non-empty object of dtypes"]
    for dtype, e in entry.items():
        if dtype not in DTYPES.values():
            errs.append(f"unknown dtype {dtype!r}")
            continue
        m = e.get("masked_max_m") if isinstance(e, dict) else None
        if not isinstance(m, dict) or set(m) != set(KINDS) or not all(isinstance(v, int) and v >= 1 for v in m.values()):
            errs.append(f"{dtype}: masked_max_m must give each of {list(KINDS)} a token count >= 1")
        u = e.get("dense_union_min") if isinstance(e, dict) else None
        if not isinstance(u, (int, float)) or not 0 < u <= 1.01:
            errs.append(f"{dtype}: dense_union_min must be in (0, 1.01]")
        for key in ("masked_full_union_min_m", "masked_full_union_max_m"):
            f = e.get(key, {}) if isinstance(e, dict) else None
            if not isinstance(f, dict) or not set(f) <= set(KINDS) or not all(isinstance(v, int) and v >= 1
                                                                              for v in f.values()):
                errs.append(f"{dtype}: {key} must give kinds of {list(KINDS)} a token count >= 1")
    return errs


def record_policy(src: Path, dest: Optional[Path] = None) -> list[str]:
    """Merge a cpu-policy.json ({cpu model: entry}, written by `bench kernels --device cpu`) into
    wide_export/cpu/policy.json, dtype by dtype (a record of float16 alone keeps the model's float32 and
    bfloat16); returns the CPU models written. A malformed record: one WideError, dest untouched."""
    from wide_export.cpu.ops import POLICY_FILE, read_table

    dest = dest or POLICY_FILE
    hint = "record the cpu-policy.json that `wide-export bench kernels --device cpu` wrote"
    recorded = read_record(src, hint)
    if not isinstance(recorded, dict) or not recorded:
        raise WideError(f"{src} is not a CPU policy record (an object of CPU models)", hint=hint)
    for model, entry in recorded.items():
        errs = validate_entry(entry)
        if model.startswith("_") or errs:
            raise WideError(f"{src} is not a valid CPU policy record: {model}: {(errs or ['reserved name'])[0]}",
                            hint=hint)
    table = read_table(dest)
    for model, entry in recorded.items():  # per dtype: a run of one dtype keeps the model's others
        table[model] = {**(table.get(model) or {}), **entry}
    tmp = dest.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=2) + "\n")
    os.replace(tmp, dest)
    return list(recorded)


def write_json(report: CpuReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(report), indent=1) + "\n")
    os.replace(tmp, path)


def table(report: CpuReport):
    from rich.table import Table

    t = Table(title=f"WIDE CPU kernels vs dense GEMM ({report.cpu}, {report.isa}, {report.threads} threads; copy "
                    f"bandwidth {report.copy_bandwidth_gbs:.1f} GB/s)")
    for col in ("dtype", "shape", "tokens", "sparsity", "union", "dense ms", "WIDE ms", "speedup", "dense MB",
                "WIDE MB", "dense GB/s (% copy)", "WIDE GB/s (% copy)", "auto"):
        t.add_column(col, justify="right")
    for r in report.rows:
        t.add_row(r.dtype, r.shape, str(r.tokens), f"{r.sparsity:.0%}", f"{r.union:.2f}", f"{r.dense_ms:.2f}",
                  "-" if r.masked_ms is None else f"{r.masked_ms:.2f}",
                  "-" if r.speedup is None else f"{r.speedup:.2f}x", f"{r.weight_bytes / 1e6:.0f}",
                  f"{r.masked_bytes / 1e6:.0f}", f"{r.dense_gbs:.1f} ({r.dense_pct_of_copy:.0f}%)",
                  "-" if r.masked_gbs is None else f"{r.masked_gbs:.1f} ({r.masked_pct_of_copy:.0f}%)", r.auto_path)
    return t


def write_plot(report: CpuReport, path: Path) -> bool:
    """Speed-up over dense vs tokens, one panel per shape, one line per dtype x sparsity."""
    plt = pyplot()
    if plt is None:
        return False
    shapes = list(dict.fromkeys(r.shape for r in report.rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for dt in dict.fromkeys(r.dtype for r in report.rows):
            for s in sorted({r.sparsity for r in report.rows}):
                pts = sorted((r.tokens, r.speedup) for r in report.rows
                             if (r.shape, r.dtype, r.sparsity) == (shape, dt, s) and r.speedup is not None)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{dt} s={s:.0%}")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(shape)
        ax.set_xlabel("tokens")
        ax.set_ylabel("WIDE kernel speed-up vs dense")
        ax.legend(fontsize=7)
    fig.suptitle(f"WIDE CPU kernels vs dense ({report.cpu}, {report.threads} threads)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
