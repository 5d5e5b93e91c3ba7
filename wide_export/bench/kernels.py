"""`wide-export bench kernels`: the WIDE CUDA kernels against dense cuBLAS.

Same run, same inputs: torch.matmul (cuBLAS) on the dense weights versus our
masked kernels on Llama-3.1-8B projection shapes, over group counts,
sparsities, mask kinds and token counts. CUDA-event timings (median after
warm-up) of launches queued behind a GPU sleep so host overhead is not timed,
with inputs rotated so the weights do not sit in L2. Results: a table, JSON,
and a PNG of speedup vs tokens (as in the WIDE paper).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.errors import WideError

# Llama-3.1-8B projections: (name, N, K, kernels to run on it).
SHAPES = [
    ("gate_up", 14336, 4096, ("gated", "n")),
    ("down", 4096, 14336, ("k",)),
    ("q_o", 4096, 4096, ("n", "k")),
]


@dataclass(frozen=True)
class Preset:
    tokens: tuple[int, ...]
    groups: tuple[int, ...]
    sparsities: tuple[float, ...]
    masks: tuple[str, ...]
    reps: int
    warmup: int


PRESETS = {
    "full": Preset(tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                   groups=(32, 128), sparsities=(0.3, 0.5, 0.7), masks=("random", "correlated"),
                   reps=20, warmup=5),
    # What scripts/gpu-check.sh runs: a few minutes on an H100/H200.
    "short": Preset(tokens=(1, 4, 16, 128, 1024, 4096, 16384), groups=(32, 128), sparsities=(0.5,),
                    masks=("random", "correlated"), reps=10, warmup=3),
}


@dataclass
class Row:
    kernel: str
    shape: str
    N: int
    K: int
    G: int
    sparsity: float
    mask: str
    tokens: int
    dense_ms: float
    wide_ms: float
    speedup: float
    active_weight_fraction: float
    bandwidth_gbs: Optional[float] = None
    bandwidth_pct_of_copy: Optional[float] = None


@dataclass
class Report:
    device: str
    dtype: str
    preset: str
    copy_bandwidth_gbs: float
    rows: list[Row] = field(default_factory=list)


def make_mask(tokens: int, groups: int, sparsity: float, kind: str, generator, device):
    """int32 [tokens, G] with P(on) = 1 - sparsity; 'correlated' tokens share most decisions."""
    import torch

    keep = 1.0 - sparsity
    rand = lambda *shape: torch.rand(*shape, generator=generator, device=device)  # noqa: E731
    if kind == "random":
        return (rand(tokens, groups) < keep).to(torch.int32)
    if kind == "correlated":  # a shared base mask, each token re-draws 15% of its decisions
        base = rand(1, groups) < keep
        fresh = rand(tokens, groups) < keep
        redraw = rand(tokens, groups) < 0.15
        return torch.where(redraw, fresh, base).to(torch.int32)
    raise ValueError(f"unknown mask kind {kind!r}")


def _time(fn: Callable[[int], object], reps: int, warmup: int) -> float:
    """Median milliseconds of fn(i) on the GPU, launches queued behind a sleep."""
    import torch

    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time: the host enqueues everything meanwhile
    for i in range(reps):
        starts[i].record()
        fn(warmup + i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth_gbs(nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth (read + write bytes per second) of a large buffer, GB/s."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _time(lambda _: dst.copy_(src), reps=10, warmup=3)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def _rotations(weight_bytes: int) -> int:
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(4, math.ceil(2 * l2 / max(weight_bytes, 1))))


def run_kernel_bench(preset: str = "short", dtype: str = "fp16", seed: int = 0,
                     progress: Optional[Callable[[str], None]] = None) -> Report:
    """Run the benchmark grid of `preset`; needs a CUDA GPU and the built kernel library."""
    import torch

    if not torch.cuda.is_available():
        raise WideError("`bench kernels` needs a CUDA GPU and none is visible",
                        hint="run it on a machine with an NVIDIA GPU (see scripts/gpu-check.sh)")
    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", hint=f"choose one of {sorted(PRESETS)}")
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise WideError(f"unknown dtype {dtype!r}", hint="fp16 or bf16")
    from wide_export.native import kernels

    kernels.load_library()  # a missing build is a clear error before any timing
    cfg = PRESETS[preset]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    report = Report(device=torch.cuda.get_device_name(0), dtype=dtype, preset=preset,
                    copy_bandwidth_gbs=copy_bandwidth_gbs())
    esize = torch.tensor([], dtype=torch_dtype).element_size()
    for shape, N, K, kinds in SHAPES:
        nw = _rotations(N * K * esize * 2)
        weights = [torch.randn(N, K, device="cuda", dtype=torch_dtype, generator=gen) * 0.02 for _ in range(nw)]
        ups = [torch.randn(N, K, device="cuda", dtype=torch_dtype, generator=gen) * 0.02 for _ in range(nw)]
        for T in cfg.tokens:
            nx = 2
            xs = [torch.randn(T, K, device="cuda", dtype=torch_dtype, generator=gen) for _ in range(nx)]
            dense_cache: dict[str, float] = {}
            for kind in kinds:
                if kind not in dense_cache:
                    dense_cache[kind] = _dense_ms(kind, xs, weights, ups, cfg)
                for G in cfg.groups:
                    for s in cfg.sparsities:
                        for mk in cfg.masks:
                            if progress:
                                progress(f"{kind} {shape} T={T} G={G} s={s} {mk}")
                            report.rows.append(_measure(kind, shape, N, K, G, s, mk, T, xs, weights, ups,
                                                        dense_cache[kind], cfg, gen, report.copy_bandwidth_gbs))
            del xs
        del weights, ups
        torch.cuda.empty_cache()
    return report


def _dense_ms(kind: str, xs, weights, ups, cfg: Preset) -> float:
    """cuBLAS baseline: one matmul (gated: one matmul over [Wg; Wu], elementwise not counted)."""
    import torch

    if kind == "gated":
        cats = [torch.cat([w, u]) for w, u in zip(weights, ups)]
        fn = lambda i: torch.matmul(xs[i % len(xs)], cats[i % len(cats)].t())  # noqa: E731
    else:
        fn = lambda i: torch.matmul(xs[i % len(xs)], weights[i % len(weights)].t())  # noqa: E731
    return _time(fn, cfg.reps, cfg.warmup)


def _measure(kind, shape, N, K, G, s, mk, T, xs, weights, ups, dense_ms, cfg, gen, copy_bw) -> Row:

    from wide_export.native import kernels

    gs = (K if kind == "k" else N) // G
    masks = [make_mask(T, G, s, mk, gen, "cuda") for _ in range(2)]
    calls = []
    for r in range(max(len(weights), len(xs))):
        w, u, x, m = weights[r % len(weights)], ups[r % len(ups)], xs[r % len(xs)], masks[r % len(masks)]
        calls.append(kernels.prepare_gemm(kind, x, w, m, gs, w2=u if kind == "gated" else None))
    wide_ms = _time(lambda i: calls[i % len(calls)](), cfg.reps, cfg.warmup)
    union = masks[0].amax(dim=0).float().mean().item()
    row = Row(kernel=kind, shape=shape, N=N, K=K, G=G, sparsity=s, mask=mk, tokens=T, dense_ms=dense_ms,
              wide_ms=wide_ms, speedup=dense_ms / wide_ms, active_weight_fraction=union)
    if T <= 4:  # decode: bytes it must read (active weight rows/segments, x, y) per second
        esize = xs[0].element_size()
        nmat = 2 if kind == "gated" else 1
        needed = union * N * K * esize * nmat + T * (K + N) * esize + masks[0].numel() * 4
        row.bandwidth_gbs = needed / (wide_ms * 1e-3) / 1e9
        row.bandwidth_pct_of_copy = 100.0 * row.bandwidth_gbs / copy_bw
    del calls
    return row


# ---------------------------------------------------------------------------
# Output
def target_checks(report: Report) -> list[tuple[str, bool, str]]:
    """The issue's targets at 50% sparsity (random masks): (name, met, evidence)."""
    rows = [r for r in report.rows if abs(r.sparsity - 0.5) < 1e-9 and r.mask == "random"]
    out = []

    def check(name, sel, pred, fmt):
        if sel:
            worst = min(sel, key=pred)
            out.append((name, all(pred(r) >= 0 for r in sel), fmt(worst)))

    check("decode (1-4 tokens) >= 1.8x", [r for r in rows if r.tokens <= 4],
          lambda r: r.speedup - 1.8, lambda r: f"worst {r.speedup:.2f}x ({r.kernel} {r.shape} T={r.tokens} G={r.G})")
    check("decode >= 85% of copy bandwidth", [r for r in rows if r.tokens <= 4],
          lambda r: (r.bandwidth_pct_of_copy or 0) - 85, lambda r: f"worst {r.bandwidth_pct_of_copy:.0f}%")
    check("never below 0.95x", report.rows, lambda r: r.speedup - 0.95,
          lambda r: f"worst {r.speedup:.2f}x ({r.kernel} {r.shape} T={r.tokens} G={r.G} s={r.sparsity} {r.mask})")
    check(">= 1.85x at >= 4k tokens, G >= 128", [r for r in rows if r.tokens >= 4096 and r.G >= 128 and r.kernel != "k"],
          lambda r: r.speedup - 1.85, lambda r: f"worst {r.speedup:.2f}x ({r.kernel} {r.shape} T={r.tokens})")
    check("K-pruned at G = 32 >= 1.0x", [r for r in rows if r.kernel == "k" and r.G == 32],
          lambda r: r.speedup - 1.0, lambda r: f"worst {r.speedup:.2f}x ({r.shape} T={r.tokens})")
    return out


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    data["targets"] = [{"target": n, "met": ok, "evidence": ev} for n, ok, ev in target_checks(report)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def write_plot(report: Report, path: Path) -> bool:
    """Speedup vs tokens, one panel per kernel/shape, one line per G (random masks). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = sorted({(r.kernel, r.shape) for r in report.rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (kind, shape) in zip(axes[0], panels):
        for G in sorted({r.G for r in report.rows}):
            for s in sorted({r.sparsity for r in report.rows}):
                pts = sorted((r.tokens, r.speedup) for r in report.rows
                             if (r.kernel, r.shape, r.G, r.sparsity, r.mask) == (kind, shape, G, s, "random"))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"G={G} s={s:.0%}")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{kind} {shape}")
        ax.set_xlabel("tokens")
        ax.set_ylabel("speedup vs cuBLAS")
        ax.legend(fontsize=7)
    fig.suptitle(f"WIDE kernels vs dense ({report.device}, {report.dtype})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def speedup_table(report: Report):
    """rich Table: one row per (kernel, shape, G, sparsity, mask), one column per token count."""
    from rich.table import Table

    tokens = sorted({r.tokens for r in report.rows})
    table = Table(title=f"speedup vs cuBLAS ({report.device}, {report.dtype}; copy bw "
                        f"{report.copy_bandwidth_gbs:.0f} GB/s)")
    for col in ("kernel", "shape", "G", "s", "mask"):
        table.add_column(col)
    for t in tokens:
        table.add_column(str(t), justify="right")
    keys = sorted({(r.kernel, r.shape, r.G, r.sparsity, r.mask) for r in report.rows})
    for key in keys:
        cells = {r.tokens: r for r in report.rows if (r.kernel, r.shape, r.G, r.sparsity, r.mask) == key}
        vals = []
        for t in tokens:
            r = cells.get(t)
            vals.append("" if r is None else (f"[red]{r.speedup:.2f}[/]" if r.speedup < 0.95 else f"{r.speedup:.2f}"))
        table.add_row(key[0], key[1], str(key[2]), f"{key[3]:.1f}", key[4], *vals)
    return table
