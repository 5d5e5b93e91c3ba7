"""`wide-export bench e2e`: a WIDE layer stack against the same stack dense, one harness, one run.

Llama-3.1-8B-shaped decoder layers with random weights (`e2e_stack.py`),
routers biased to a chosen sparsity; attention through PyTorch SDPA on both
sides, `wide_export.kernels` on the WIDE side, cuBLAS on the dense side.
Prefill tokens/s at 512 / 2k / 8k tokens (one sequence) and decode tokens/s
at batch 1 and 4 (one step over a cache of `decode_context` tokens). On a GPU
both sides of every case are captured as CUDA graphs and replayed (no Python
launch overhead on either side; eager timing, with a note, if capture fails).
The stack has fewer layers than the model; its time per layer scales to the
model's 32 layers (embedding and LM head left out, the same on
both sides). Before timing, the first layer of the WIDE side is checked
against the PyTorch oracles (mask agreement, output error) on the same input.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.bench.common import CPU_DTYPES, cuda_or_tiny, model_rates, time_ms, torch_dtype
from wide_export.base.errors import WideError

PAPER = {"prefill": 1.68, "decode": 1.55}  # WIDE paper, end to end at 50 % sparsity (RTX 5090)


@dataclass(frozen=True)
class E2EPreset:
    shape: str
    layers: int
    prefill_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_context: int
    calib_tokens: int
    reps: int
    warmup: int


PRESETS = {
    # What scripts/gpu-check.sh can run: well under 90 s on an H100/H200 (Triton JIT compiles included).
    "llama-3.1-8b": E2EPreset("llama-3.1-8b", layers=4, prefill_tokens=(512, 2048, 8192), decode_batches=(1, 4),
                              decode_context=1024, calib_tokens=512, reps=10, warmup=3),
    # --device cpu: Llama-3.1-8B layers on this CPU through wide_export.cpu (2 layers: 1.7 GB of fp32 weights per
    # token each side, over three times this machine's 480 MiB L3); prefill 128 / 512, decode batch 1 / 4 / 16.
    "llama-3.1-8b-cpu": E2EPreset("llama-3.1-8b", layers=2, prefill_tokens=(128, 512), decode_batches=(1, 4, 16),
                                  decode_context=512, calib_tokens=256, reps=5, warmup=2),
    # CPU smoke run of the harness through the Triton interpreter: the timings mean nothing.
    "tiny": E2EPreset("tiny", layers=2, prefill_tokens=(16, 64), decode_batches=(1, 4), decode_context=16,
                      calib_tokens=64, reps=1, warmup=0),
}


@dataclass
class Case:
    sparsity: float
    phase: str                # prefill | decode
    tokens: int               # prefill: sequence length; decode: batch (one token per sequence)
    dense_ms: float           # the stack, measured
    wide_ms: float
    dense_tokens_per_s: float  # scaled to the model's layer count
    wide_tokens_per_s: float
    speedup: float
    cuda_graph: bool = False
    algos: dict = field(default_factory=dict)  # projection -> the algorithm the WIDE side ran
    note: str = ""


@dataclass
class E2EReport:
    device: str
    dtype: str
    preset: str
    shape: dict
    layers: int               # in the timed stack
    model_layers: int         # what tokens/s scale to
    decode_context: int
    algo: str
    realized: dict = field(default_factory=dict)   # sparsity -> {"attention": x, "ffn": y} on the prefill input
    check: dict = field(default_factory=dict)      # sparsity -> {"mask_agreement", "max_rel_error"}
    cases: list[Case] = field(default_factory=list)
    paper: dict = field(default_factory=lambda: dict(PAPER))
    timings_meaningful: bool = True
    # --device cpu: llama.cpp dense on layers of the same shapes, {"runner": {"prefill 128": tok/s, "decode b=1":
    # tok/s, ...}} scaled like the cases; notes: one line where its rows are left out
    llamacpp: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def plan_e2e_bench(preset: str, sparsities=(0.25, 0.5, 0.75), dtype: str = "fp16", layers: Optional[int] = None,
                   algo: str = "auto", device: str = "auto") -> list[str]:
    """The cases `preset` would time, one line each, in run order; every option checked and the WIDE side's
    kernels imported (Triton included), no tensor made: `bench e2e --dry-run` (scripts/gpu-check.sh's CI dry
    run: the benchmark starts on the device's Python before a GPU is spent on it)."""
    from wide_export.bench import e2e_stack as st
    from wide_export.kernels.policy import ALGOS

    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", hint=f"choose one of {sorted(PRESETS)}")
    if device not in ("auto", "cpu"):
        raise WideError(f"unknown --device {device!r}", hint="cpu (the compiled CPU kernels), or auto")
    if device == "cpu":
        if dtype not in CPU_DTYPES:
            raise WideError(f"--device cpu runs {sorted(CPU_DTYPES)}, not {dtype!r}",
                            hint="--dtype " + " or ".join(CPU_DTYPES))
    else:
        torch_dtype(dtype)
    if not sparsities or any(not 0.0 <= s < 1.0 for s in sparsities):
        raise WideError(f"sparsities must lie in [0, 1), got {list(sparsities)}", hint="e.g. --sparsity 0.5")
    if layers is not None and layers < 1:
        raise WideError(f"--layers {layers} must be at least 1", hint="e.g. --layers 4")
    if algo not in ALGOS:
        raise WideError(f"unknown algorithm {algo!r}", hint=f"one of {list(ALGOS)}")
    if device != "cpu":  # what the WIDE side launches on a GPU (Triton, our kernels); --device cpu needs neither
        from wide_export.kernels import launch, triton_kernels  # noqa: F401

        st.kernel_ops(algo)
    cfg = PRESETS[preset]
    return [line for s in sparsities
            for line in [f"prefill {T} tokens at {s:.0%}" for T in cfg.prefill_tokens]
            + [f"decode batch {B} at {s:.0%}" for B in cfg.decode_batches]]


def run_e2e_bench(preset: Optional[str] = None, sparsities=(0.25, 0.5, 0.75), dtype: str = "fp16",
                  layers: Optional[int] = None, algo: str = "auto", seed: int = 0,
                  progress: Optional[Callable[[str], None]] = None, device: str = "auto",
                  llamacpp: bool = True) -> E2EReport:
    """Time the dense and the WIDE stack at every sparsity (default preset: GPU llama-3.1-8b, CPU tiny;
    device="cpu": the compiled CPU kernels against torch's dense GEMMs, default preset llama-3.1-8b-cpu, and
    with `llamacpp` llama.cpp dense on the same cases, bench/e2e_llamacpp.py)."""
    import torch

    from wide_export.bench import e2e_stack as st

    on_cpu = device == "cpu"
    preset = preset or ("llama-3.1-8b-cpu" if on_cpu else "llama-3.1-8b" if torch.cuda.is_available() else "tiny")
    plan_e2e_bench(preset, sparsities, dtype, layers, algo, device)
    if on_cpu:
        from wide_export.cpu import ops as cpu_ops

        cpu_ops.require(": the WIDE side would be dense")
        cuda, dt = False, getattr(torch, CPU_DTYPES[dtype])
    else:
        cuda = cuda_or_tiny(f"bench e2e --preset {preset}", preset)
        dt = torch_dtype(dtype)
    cfg = PRESETS[preset]
    shape = st.LLAMA_8B if cfg.shape == "llama-3.1-8b" else st.TINY
    n_layers = layers or cfg.layers
    say = progress or (lambda _m: None)
    device = torch.device("cuda" if cuda else "cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    say(f"{n_layers} random {shape.name} layers")
    stack = st.random_stack(shape, n_layers, dt, device, gen)
    if on_cpu:
        st.pack_for_cpu(shape, stack)
    where = (f"cpu: {cpu_ops.cpu_model()}, {cpu_ops.isa()}, {torch.get_num_threads()} threads" if on_cpu
             else torch.cuda.get_device_name(0) if cuda else "cpu (Triton interpreter)")
    report = E2EReport(device=where, dtype=dtype, preset=preset, shape=asdict(shape), layers=n_layers,
                       model_layers=shape.model_layers, decode_context=cfg.decode_context,
                       algo="cpu" if on_cpu else algo, timings_meaningful=cuda or on_cpu)
    ops = st.cpu_ops() if on_cpu else st.kernel_ops(algo)
    calib = torch.randn(1, cfg.calib_tokens, shape.hidden, generator=gen, device=device).to(dt)
    for s in sparsities:
        say(f"calibrating routers to {s:.0%} sparsity")
        st.calibrate(shape, stack, calib, s)
        report.check[str(s)] = _check_first_layer(shape, stack[0], calib, ops)
        for T in cfg.prefill_tokens:
            say(f"prefill {T} tokens at {s:.0%}")
            report.cases.append(_prefill(shape, stack, ops, T, s, cfg, gen, report, cuda))
        for B in cfg.decode_batches:
            say(f"decode batch {B} at {s:.0%}")
            report.cases.append(_decode(shape, stack, ops, B, s, cfg, gen, report.model_layers, cuda))
    if on_cpu and llamacpp:
        from wide_export.bench.e2e_llamacpp import time_llamacpp

        del stack, calib  # llama.cpp holds its own copy of the layers
        report.llamacpp, why = time_llamacpp(shape, n_layers, cfg, CPU_DTYPES[dtype], seed, say)
        if why:
            report.notes.append(why)
    return report


def _check_first_layer(shape, layer, h, ops) -> dict:
    """Kernel masks vs the reference router, and the kernel layer vs the reference layer given those masks."""
    import torch

    from wide_export.bench import e2e_stack as st

    ref = st.reference_ops()
    rotary = st.rope(torch.arange(h.shape[1], device=h.device), shape.head_dim, h.dtype)
    got_masks, want_masks = [], []
    got = st.wide_layer(shape, layer, h, rotary, ops, masks=got_masks).float()
    st.wide_layer(shape, layer, h, rotary, ref, masks=want_masks)
    replay = iter([m for pair in got_masks for m in pair])
    fixed = type(ref)(**{**vars(ref), "router": lambda *_a: next(replay)})
    want = st.wide_layer(shape, layer, h, rotary, fixed).float()
    agree = torch.cat([(a == b).flatten() for a, b in zip(got_masks[0], want_masks[0])]).float().mean().item()
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
    return {"mask_agreement": agree, "max_rel_error": err}


def _timed_with_paths(timed):
    """(timed(), paths): which path each projection's calls took in the WIDE passes timed() ran
    (wide_export.cpu.ops.PATHS): masked, dense or mixed (layers apart); o and down share one counter (both
    K-pruned)."""
    from wide_export.cpu.ops import PATHS

    PATHS.clear()
    result = timed()
    seen = {k: {p for (kind, p), n in PATHS.items() if kind == k and n} for k in ("n", "gated", "k")}
    name = {k: (next(iter(v)) if len(v) == 1 else "mixed") for k, v in seen.items()}
    return result, {"q": name["n"], "o": name["k"], "gate_up": name["gated"], "down": name["k"]}


def _algos(shape, M: int, algo: str, device) -> dict:
    from wide_export.kernels.launch import policy_of
    from wide_export.kernels.policy import choose

    if algo != "auto":
        return dict.fromkeys(("q", "o", "gate_up", "down"), algo)
    pol = policy_of(device)
    qd, H, I = shape.heads * shape.head_dim, shape.hidden, shape.intermediate  # [N, K] of each, for per-shape rules
    return {"q": choose("n", M, shape.attn_group_size, pol, qd, H),
            "o": choose("k", M, shape.attn_group_size, pol, H, qd),
            "gate_up": choose("gated", M, shape.ffn_group_size, pol, I, H),
            "down": choose("k", M, shape.ffn_group_size, pol, H, I)}


def _prefill(shape, stack, ops, T: int, s: float, cfg: E2EPreset, gen, report: E2EReport, cuda: bool) -> Case:
    """One sequence of T tokens through the stack from an empty cache (causal SDPA)."""
    import torch

    from wide_export.bench import e2e_stack as st

    dtype = stack[0].wq.dtype
    x = torch.randn(1, T, shape.hidden, generator=gen, device=stack[0].wq.device).to(dtype)
    rotary = st.rope(torch.arange(T, device=x.device), shape.head_dim, dtype)

    def dense():
        h = x
        for L in stack:
            h = st.dense_layer(shape, L, h, rotary)
        return h

    def wide(masks=None):
        h = x
        for L in stack:
            h = st.wide_layer(shape, L, h, rotary, ops, masks=masks)
        return h

    with torch.no_grad():
        if T == cfg.prefill_tokens[0]:  # realized sparsity on a fresh input (not the calibration tokens)
            masks: list = []
            wide(masks)
            report.realized[str(s)] = {kind: 1.0 - torch.cat([m[j].flatten() for m in masks]).float().mean().item()
                                       for j, kind in enumerate(("attention", "ffn"))}
    if report.algo == "cpu":
        (d_ms, w_ms, graphed, note), algos = _timed_with_paths(lambda: _time_pair(dense, wide, cfg, cuda))
    else:
        (d_ms, w_ms, graphed, note), algos = _time_pair(dense, wide, cfg, cuda), _algos(shape, T, report.algo,
                                                                                       x.device)
    d_tps, w_tps = model_rates((d_ms, w_ms), T, len(stack), shape.model_layers)
    return Case(s, "prefill", T, d_ms, w_ms, d_tps, w_tps, d_ms / w_ms, cuda_graph=graphed, algos=algos, note=note)


def _decode(shape, stack, ops, B: int, s: float, cfg: E2EPreset, gen, model_layers: int, cuda: bool) -> Case:
    """One decode step (one token per sequence) over a full cache of `decode_context` tokens."""
    import torch

    from wide_export.bench import e2e_stack as st

    dtype, device = stack[0].wq.dtype, stack[0].wq.device
    ctx = cfg.decode_context
    h0 = torch.randn(B, 1, shape.hidden, generator=gen, device=device).to(dtype)
    rotary = st.rope(torch.tensor([ctx], device=device), shape.head_dim, dtype)
    caches = [tuple(torch.randn(B, shape.kv_heads, ctx + 1, shape.head_dim, generator=gen, device=device).to(dtype)
                    for _ in range(2)) + (ctx,) for _ in stack]

    def dense():
        h = h0
        for L, c in zip(stack, caches):
            h = st.dense_layer(shape, L, h, rotary, c)
        return h

    def wide():
        h = h0
        for L, c in zip(stack, caches):
            h = st.wide_layer(shape, L, h, rotary, ops, c)
        return h

    if ops.algo == "cpu":
        (d_ms, w_ms, graphed, note), algos = _timed_with_paths(lambda: _time_pair(dense, wide, cfg, cuda))
    else:
        (d_ms, w_ms, graphed, note), algos = _time_pair(dense, wide, cfg, cuda), _algos(shape, B, ops.algo, device)
    d_tps, w_tps = model_rates((d_ms, w_ms), B, len(stack), model_layers)
    return Case(s, "decode", B, d_ms, w_ms, d_tps, w_tps, d_ms / w_ms, cuda_graph=graphed, algos=algos, note=note)


def _time_pair(dense, wide, cfg: E2EPreset, cuda: bool):
    """(dense ms, WIDE ms, as CUDA graphs?, note): on a GPU both sides are captured as CUDA graphs and
    replayed, so neither side's Python launch overhead is timed; eagerly on CPU or if capture fails."""
    import torch


    note, graphed = "", False
    with torch.no_grad():
        fns = [dense, wide]
        if cuda:
            try:
                fns = [_graph(fn) for fn in fns]
                graphed = True
            except Exception as err:  # noqa: BLE001 - report and time eagerly rather than give no number
                note = f"CUDA graph capture failed ({type(err).__name__}: {str(err)[:120]}); timed eagerly"
                torch.cuda.synchronize()
        d_ms, w_ms = (time_ms(lambda _i, f=f: f(), cfg.reps, cfg.warmup, cuda) for f in fns)
    return d_ms, w_ms, graphed, note


def _graph(fn):
    """fn captured as a CUDA graph (after warm-up on a side stream: JIT compiles happen there); returns replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


# ---------------------------------------------------------------------------
# Output
def write_json(report: E2EReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(report), indent=2))
    tmp.replace(path)


def _size(c: Case) -> str:
    return f"{c.tokens}" if c.phase == "prefill" else f"b={c.tokens}"


def _tps(v: float) -> str:
    """Tokens/s for the table: whole numbers from 100 up, two decimals below (CPU runs of 8B layers: ~1 tok/s)."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def table(report: E2EReport):
    from rich.table import Table

    from rich import box

    t = Table(box=box.SIMPLE_HEAD,
              title=f"end to end, {report.shape['name']} layers ({report.layers} timed, tokens/s scaled to "
                    f"{report.model_layers}; {report.device}, {report.dtype})")
    llama = list(report.llamacpp)
    for col in ("sparsity", "case", "dense tok/s", "WIDE tok/s", "speed-up (paper)", "algos",
                *(f"{r} tok/s" for r in llama), *(f"WIDE / {r}" for r in llama)):
        t.add_column(col, justify="right", no_wrap=True)
    for c in report.cases:
        paper = f" ({PAPER[c.phase]:.2f}x)" if abs(c.sparsity - 0.5) < 1e-9 else ""
        theirs = [report.llamacpp[r].get(f"{c.phase} {_size(c)}") for r in llama]
        t.add_row(f"{c.sparsity:.0%}", f"{c.phase} {_size(c)}", _tps(c.dense_tokens_per_s), _tps(c.wide_tokens_per_s),
                  f"[{'green' if c.speedup >= 1 else 'red'}]{c.speedup:.2f}x[/]{paper}",
                  "/".join(a[:2] for a in c.algos.values()),
                  *(_tps(v) if v else "-" for v in theirs),
                  *(f"{c.wide_tokens_per_s / v:.2f}x" if v else "-" for v in theirs))
    graphs = "replayed as CUDA graphs" if all(c.cuda_graph for c in report.cases) else (
        "partly eager (see notes)" if any(c.cuda_graph for c in report.cases) else "timed eagerly")
    if report.algo == "cpu":
        t.caption = ("algos: q/o/gate_up/down as they ran (ma = masked CPU kernel, de = dense GEMM + mask, mi = "
                     "mixed); timed eagerly" + ("; llama.cpp: dense, layers of the same shapes in a GGUF, the same "
                                                "threads, scaled alike" if llama else ""))
    else:
        t.caption = f"algos: q/o/gate_up/down (gemv, grouped, tile, dense); both sides {graphs}"
    return t


def write_plot(report: E2EReport, path: Path) -> bool:
    """Speed-up per case, one bar per sparsity, the paper's figures as dashed lines. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = list(dict.fromkeys(f"{c.phase}\n{_size(c)}" for c in report.cases))
    sparsities = sorted({c.sparsity for c in report.cases})
    fig, ax = plt.subplots(figsize=(1.3 * len(labels) + 3, 3.8))
    width = 0.8 / len(sparsities)
    for j, s in enumerate(sparsities):
        vals = {f"{c.phase}\n{_size(c)}": c.speedup for c in report.cases if c.sparsity == s}
        ax.bar([i + (j - (len(sparsities) - 1) / 2) * width for i in range(len(labels))],
               [vals.get(lab, 0.0) for lab in labels], width, label=f"sparsity {s:.0%}")
    for r, marker in zip(report.llamacpp, "xo+"):  # WIDE over llama.cpp dense, at each bar
        for j, s in enumerate(sparsities):
            vals = {f"{c.phase}\n{_size(c)}": c.wide_tokens_per_s / report.llamacpp[r][f"{c.phase} {_size(c)}"]
                    for c in report.cases if c.sparsity == s and report.llamacpp[r].get(f"{c.phase} {_size(c)}")}
            xs = [i + (j - (len(sparsities) - 1) / 2) * width for i, lab in enumerate(labels) if lab in vals]
            ax.scatter(xs, [vals[lab] for lab in labels if lab in vals], marker=marker, color="black", zorder=3,
                       s=18, label=f"WIDE / {r}" if j == 0 else None)
    for phase, style in (("prefill", "--"), ("decode", ":")):
        ax.axhline(PAPER[phase], color="gray", ls=style, lw=1, label=f"paper {phase} at 50 % ({PAPER[phase]}x)")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("WIDE / dense (bars)" + (", WIDE / llama.cpp (marks)" if report.llamacpp else ""))
    title = f"WIDE vs dense, {report.shape['name']} layers ({report.device}, {report.dtype})"
    ax.set_title(title if report.timings_meaningful else title + "\nCPU interpreter: timings mean nothing",
                 fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
