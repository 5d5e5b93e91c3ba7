"""`wide-export bench kernels`: the WIDE Triton kernels against dense cuBLAS.

Same run, same inputs: the dense model's projection (torch.matmul, i.e.
cuBLAS, on the full weights) versus every algorithm of ``wide_export.kernels``
(``gemv``, ``grouped``, ``tile``, ``dense`` = cuBLAS + mask) and what ``auto``
picks, on Llama-3.1-8B and Qwen3-8B projection shapes (recipes), over group
sizes, sparsities, mask kinds and token counts. CUDA-event timings (median
after warm-up) of launches queued behind a GPU sleep so host overhead is not
timed, with inputs rotated so the weights do not sit in L2. Every timed case's
output is checked once against ``wide_export.ops.reference``. Results: a
table, JSON (rewritten after every case, so a timeout keeps what was done), a
PNG of speedup vs tokens (as in the WIDE paper), the measured ``auto``
thresholds for this GPU as ``policy-<arch>.json`` (per kernel kind, against
plain dense; ``--record`` merges one into ``wide_export/kernels/policy.json``),
and a roofline per case: the bytes the case must move (weights its mask needs
at least once, activations, mask) and its FLOPs, the time they take at the
device's copy bandwidth and tensor throughput, and the kernel's % of it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.bench.common import cuda_or_tiny, read_record, time_ms, torch_dtype
from wide_export.base.errors import WideError

# Projection shapes (model, name, N, K, kernel): Llama-3.1-8B and Qwen3-8B (recipes/).
SHAPES = [
    ("llama-3.1-8b", "q", 4096, 4096, "n"),
    ("llama-3.1-8b", "o", 4096, 4096, "k"),
    ("llama-3.1-8b", "gate_up", 14336, 4096, "gated"),
    ("llama-3.1-8b", "down", 4096, 14336, "k"),
    ("qwen3-8b", "gate_up", 12288, 4096, "gated"),
    ("qwen3-8b", "down", 4096, 12288, "k"),
]
ALGOS = ("gemv", "grouped", "tile", "dense")


@dataclass(frozen=True)
class Preset:
    tokens: tuple[int, ...]
    group_sizes: tuple[int, ...]
    sparsities: tuple[float, ...]
    masks: tuple[str, ...]
    reps: int
    warmup: int
    models: tuple[str, ...] = ("llama-3.1-8b", "qwen3-8b")


PRESETS = {
    "full": Preset(tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                   group_sizes=(32, 128, 512), sparsities=(0.25, 0.5, 0.75), masks=("random", "correlated"),
                   reps=20, warmup=5),
    # What scripts/gpu-check.sh runs (within its 120 s stage, JIT compiles included): Llama-3.1-8B, 50 % random.
    "short": Preset(tokens=(1, 4, 16, 256, 4096, 16384), group_sizes=(32, 128, 512), sparsities=(0.5,),
                    masks=("random",), reps=6, warmup=2, models=("llama-3.1-8b",)),
    # A CPU smoke run of the harness itself (interpreter; timings meaningless).
    "tiny": Preset(tokens=(1, 20), group_sizes=(16,), sparsities=(0.5,), masks=("random",), reps=1, warmup=0,
                   models=("tiny",)),
}
TINY_SHAPES = [("tiny", "q", 64, 48, "n"), ("tiny", "gate_up", 64, 48, "gated"), ("tiny", "down", 48, 64, "k")]


# An H200's published figures; the roofline of a CPU run uses them (its timings mean
# nothing, so its % of the limit is not reported), a GPU run measures its own.
H200_COPY_GBS = 4300.0
H200_BF16_TFLOPS = 790.0

INTERPRETER_NOTE = ("CPU run through the Triton interpreter: the kernels' code ran, but their timings (and the "
                    "speed-ups against torch's CPU matmul) say nothing about a GPU")


@dataclass
class Row:
    kernel: str
    shape: str
    N: int
    K: int
    group_size: int
    sparsity: float
    mask: str
    tokens: int
    dense_ms: float          # the dense model's op (cuBLAS), the 1.0x line
    algo_ms: dict            # every algorithm timed on this case
    auto_algo: str           # what algo="auto" picks here
    wide_ms: float           # = algo_ms[auto_algo]
    speedup: float           # dense_ms / wide_ms
    active_weight_fraction: float  # mean over tokens of the fraction of weight groups a token executes
    max_rel_error: float = 0.0
    bandwidth_gbs: Optional[float] = None
    bandwidth_pct_of_copy: Optional[float] = None
    bytes_needed: int = 0             # weight bytes the mask needs at least once + x, y and the mask
    flops: int = 0                    # 2 x the multiply-adds of the tokens' executing groups
    roofline_ms: float = 0.0          # max(bytes / copy bandwidth, flops / tensor throughput)
    pct_of_roofline: Optional[float] = None  # 100 x roofline_ms / wide_ms (None: CPU interpreter)

    @property
    def G(self) -> int:
        return (self.K if self.kernel == "k" else self.N) // self.group_size


@dataclass
class Report:
    device: str
    arch: str
    dtype: str
    preset: str
    copy_bandwidth_gbs: float
    rows: list[Row] = field(default_factory=list)
    tensor_tflops: float = H200_BF16_TFLOPS
    roofline_copy_gbs: float = H200_COPY_GBS  # the measured copy bandwidth on a GPU
    roofline_basis: str = "H200 reference figures (4.3 TB/s copy, 790 TFLOP/s bf16)"
    complete: bool = False


def skipped_per_token(groups: int, sparsity: float) -> int:
    """The groups each token skips: round(G * sparsity), but at least one kept and one skipped whenever the
    label is strictly between 0 and 1 (a 0.5 row must not run everything, or nothing, at a small G)."""
    k = round(groups * sparsity)
    if 0.0 < sparsity < 1.0 and groups >= 2:
        k = min(max(k, 1), groups - 1)
    return k


def make_mask(tokens: int, groups: int, sparsity: float, kind: str, generator, device):
    """int32 [tokens, G]: every token skips exactly skipped_per_token(G, sparsity) groups, which ones drawn at
    random ('random'), or mostly shared between tokens ('correlated': a common ranking of the groups, 15 % of
    each token's places re-drawn)."""
    import torch

    if kind not in ("random", "correlated"):
        raise ValueError(f"unknown mask kind {kind!r}")
    rand = lambda *shape: torch.rand(*shape, generator=generator, device=device)  # noqa: E731
    score = rand(tokens, groups)  # a token skips the groups of its k lowest scores
    if kind == "correlated":
        score = torch.where(rand(tokens, groups) < 0.15, score, rand(1, groups).expand(tokens, groups))
    k = skipped_per_token(groups, sparsity)
    rank = score.argsort(dim=1).argsort(dim=1)  # each group's place in its token's order
    return (rank >= k).to(torch.int32)


def copy_bandwidth_gbs(cuda: bool, nbytes: int = 1 << 30) -> float:
    """Device copy bandwidth (read + write bytes per second) of a large buffer, GB/s."""
    import torch

    if not cuda:
        nbytes = 1 << 24
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda" if cuda else "cpu")
    dst = torch.empty_like(src)
    ms = time_ms(lambda _: dst.copy_(src), reps=10, warmup=3, cuda=cuda)
    del src, dst
    return 2 * nbytes / (ms * 1e-3) / 1e9


def tensor_tflops(cuda: bool, dtype) -> float:
    """Dense matmul throughput (TFLOP/s) of this GPU in `dtype`: one 8192^3 cuBLAS GEMM, median of 5."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_ms(lambda _: torch.matmul(a, b), reps=5, warmup=2, cuda=cuda)
    del a, b
    return 2 * n**3 / (ms * 1e-3) / 1e12


def roofline(kind: str, N: int, K: int, gs: int, mask, esize: int) -> tuple[int, int]:
    """(bytes, FLOPs) a masked GEMM must move / do: the weight groups any token executes, read once, plus x, y
    and the mask; FLOPs over each token's own executing groups (gated: two weights)."""
    nmat = 2 if kind == "gated" else 1
    m = mask.bool()
    T, G = m.shape
    union = m.any(dim=0).float().mean().item() if T else 0.0
    per_token = m.float().mean(dim=1).sum().item()
    weight_bytes = union * N * K * esize * nmat
    return int(weight_bytes + T * (K + N) * esize + T * G * 4), int(2 * per_token * N * K * nmat)


def _rotations(weight_bytes: int, cuda: bool) -> int:
    import torch

    if not cuda:
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(4, math.ceil(2 * l2 / max(weight_bytes, 1))))


def plan_kernel_bench(preset: str = "short", dtype: str = "bf16") -> list[str]:
    """The cases `preset` would time, one line each, in run order; every option checked and the kernel
    modules imported (Triton included), no tensor made: `bench kernels --dry-run`, which scripts/gpu-check.sh's
    CI dry run uses to prove the benchmark starts on the device's Python before a GPU is spent on it."""
    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", hint=f"choose one of {sorted(PRESETS)}")
    torch_dtype(dtype)
    from wide_export.kernels import launch, triton_kernels  # noqa: F401 - what the run launches (Triton, our kernels)

    cfg = PRESETS[preset]
    shapes = TINY_SHAPES if preset == "tiny" else [s for s in SHAPES if s[0] in cfg.models]
    return [f"{kind} {model}/{name} T={T} gs={gs} s={s} {mk}"
            for T in cfg.tokens for model, name, N, K, kind in shapes for gs in cfg.group_sizes
            if not (K if kind == "k" else N) % gs for s in cfg.sparsities for mk in cfg.masks]


def run_kernel_bench(preset: str = "short", dtype: str = "bf16", seed: int = 0,
                     progress: Optional[Callable[[str], None]] = None,
                     on_row: Optional[Callable[[Report], None]] = None) -> Report:
    """Run the benchmark grid of `preset` (GPU; the 'tiny' preset also runs on CPU through the interpreter).

    on_row(report) is called after every case (the CLI rewrites kernels.json there)."""
    import torch

    plan_kernel_bench(preset, dtype)
    cuda = cuda_or_tiny("bench kernels", preset, "run it on a machine with an NVIDIA GPU (scripts/gpu-check.sh)")
    dt = torch_dtype(dtype)
    from wide_export.kernels.launch import arch_of

    device = torch.device("cuda" if cuda else "cpu")
    cfg = PRESETS[preset]
    gen = torch.Generator(device=device).manual_seed(seed)
    report = Report(device=torch.cuda.get_device_name(0) if cuda else "cpu (Triton interpreter)",
                    arch=arch_of(device), dtype=dtype, preset=preset, copy_bandwidth_gbs=copy_bandwidth_gbs(cuda))
    if cuda:
        report.tensor_tflops = tensor_tflops(cuda, dt)
        report.roofline_copy_gbs = report.copy_bandwidth_gbs
        report.roofline_basis = "measured on this GPU (copy bandwidth, 8192^3 cuBLAS GEMM)"
    esize = torch.tensor([], dtype=dt).element_size()
    shapes = TINY_SHAPES if preset == "tiny" else [s for s in SHAPES if s[0] in cfg.models]
    mats = {}
    for model, name, N, K, kind in shapes:
        nw = _rotations(N * K * esize * (2 if kind == "gated" else 1), cuda)
        weights = [torch.randn(N, K, device=device, dtype=dt, generator=gen) * 0.02 for _ in range(nw)]
        ups = ([torch.randn(N, K, device=device, dtype=dt, generator=gen) * 0.02 for _ in range(nw)]
               if kind == "gated" else weights)  # up weights only where they are read
        mats[(model, name)] = weights, ups
    # Token counts outermost: a run cut short (gpu-check.sh's stage timeout) has every shape at the smallest
    # token counts (decode) rather than every token count of the first shapes.
    for T in cfg.tokens:
        for model, name, N, K, kind in shapes:
            weights, ups = mats[(model, name)]
            xs = [torch.randn(T, K, device=device, dtype=dt, generator=gen) for _ in range(2)]
            dense = _dense_ms(kind, xs, weights, ups, cfg, cuda)
            for gs in cfg.group_sizes:
                if (K if kind == "k" else N) % gs:
                    continue
                for s in cfg.sparsities:
                    for mk in cfg.masks:
                        if progress:
                            progress(f"{kind} {model}/{name} T={T} gs={gs} s={s} {mk}")
                        report.rows.append(_measure(kind, f"{model}/{name}", N, K, gs, s, mk, T, xs, weights, ups,
                                                    dense, cfg, gen, report, cuda))
                        if on_row:
                            on_row(report)
            del xs
    del mats
    if cuda:
        torch.cuda.empty_cache()
    report.complete = True
    return report


def _dense_ms(kind: str, xs, weights, ups, cfg: Preset, cuda: bool) -> float:
    """The dense model's op: one cuBLAS matmul (gated: over [Wg; Wu], then silu(g) * u as the model does)."""
    import torch

    if kind == "gated":
        cats = [torch.cat([w, u]) for w, u in zip(weights, ups)]

        def fn(i):
            gu = torch.matmul(xs[i % len(xs)], cats[i % len(cats)].t())
            g, u = gu.chunk(2, dim=-1)
            return torch.nn.functional.silu(g) * u
    else:
        def fn(i):
            return torch.matmul(xs[i % len(xs)], weights[i % len(weights)].t())
    return time_ms(fn, cfg.reps, cfg.warmup, cuda)


def _call(kind, algo, x, w, u, m, gs):
    """`algo` as in wide_export.kernels, or "<algo>@<size>" (configs.SIZES: small, large, wide) to force the
    prefill GEMM's size class."""
    from wide_export import kernels

    algo, _, tiles = algo.partition("@")
    kw = dict(algo=algo, tiles=tiles or "auto")
    if kind == "gated":
        return kernels.masked_gated_mlp(x, w, u, m, gs, **kw)
    if kind == "k":
        return kernels.masked_gemm_k(x, w, m, gs, **kw)
    return kernels.masked_gemm_n(x, w, m, gs, **kw)


def _reference(kind, x, w, u, m, gs):
    from wide_export.ops import reference as ref

    if kind == "gated":
        return ref.masked_gated_mlp(x, w, u, m, gs)
    if kind == "k":
        return ref.masked_gemm_k(x, w, m, gs)
    return ref.masked_gemm_n(x, w, m, gs)


TILE_TUNE_MIN_T = 256  # from this T a GPU run times the prefill GEMMs at every size class (measured_prefill_tiles)
TILE_TUNE_GROUP_SIZE = 128  # ... at this group size only (the bucket table is per family, not per group size)


def _algos_for(kind: str, T: int, gs: int, cuda: bool, sizes_ok: bool = False) -> list[str]:
    """The algorithms a case times; `sizes_ok`: the device has the large / wide tiles (configs.large_tiles),
    so from TILE_TUNE_MIN_T tokens each prefill GEMM is also timed at each of its family's size classes."""
    from wide_export.kernels.configs import TILE_FAMILIES, family, grouped_block_n

    tune = cuda and sizes_ok and T >= TILE_TUNE_MIN_T and gs == TILE_TUNE_GROUP_SIZE
    out = []
    if T <= 64:
        out.append("gemv")
    if T >= 16 and (kind == "k" or grouped_block_n(gs)):
        out.append("grouped")
        if tune and kind != "k":  # the K-pruned grouped GEMM has one tile size
            out += [f"grouped@{z}" for z in TILE_FAMILIES[family(kind, "grouped")]]
    if T >= 16:
        out.append("tile")
        if tune:
            out += [f"tile@{z}" for z in TILE_FAMILIES[family(kind, "tile")]]
    if cuda:
        out.append("dense")
    return out


def _measure(kind, shape, N, K, gs, s, mk, T, xs, weights, ups, dense_ms, cfg, gen, report, cuda) -> Row:
    from wide_export.kernels.configs import large_tiles
    from wide_export.kernels.launch import arch_of, policy_of
    from wide_export.kernels.policy import choose

    G = (K if kind == "k" else N) // gs
    device = xs[0].device
    masks = [make_mask(T, G, s, mk, gen, device) for _ in range(2)]
    n = max(len(weights), len(xs))
    auto = choose(kind, T, gs, policy_of(device), N, K)
    algos = _algos_for(kind, T, gs, cuda, large_tiles(arch_of(device), str(xs[0].dtype)[6:]))
    if auto not in algos:
        algos.append(auto)
    worst = 0.0
    want = _reference(kind, xs[0], weights[0], ups[0], masks[0], gs).float()
    scale = max(1e-6, want.abs().max().item())
    times = {}
    for algo in algos:
        got = _call(kind, algo, xs[0], weights[0], ups[0], masks[0], gs).float()
        worst = max(worst, (got - want).abs().max().item() / scale)
        times[algo] = time_ms(lambda i, a=algo: _call(kind, a, xs[i % len(xs)], weights[i % n % len(weights)],
                                                    ups[i % n % len(ups)], masks[i % len(masks)], gs),
                            cfg.reps, cfg.warmup, cuda)
    active = masks[0].float().mean().item()
    row = Row(kernel=kind, shape=shape, N=N, K=K, group_size=gs, sparsity=s, mask=mk, tokens=T, dense_ms=dense_ms,
              algo_ms=times, auto_algo=auto, wide_ms=times[auto], speedup=dense_ms / times[auto],
              active_weight_fraction=active, max_rel_error=worst)
    esize = xs[0].element_size()
    row.bytes_needed, row.flops = roofline(kind, N, K, gs, masks[0], esize)
    row.roofline_ms = max(row.bytes_needed / (report.roofline_copy_gbs * 1e9),
                          row.flops / (report.tensor_tflops * 1e12)) * 1e3
    if cuda:
        row.pct_of_roofline = 100.0 * row.roofline_ms / row.wide_ms
    if T <= 4 and "gemv" in times:  # decode: the bytes each token must read, per second
        nmat = 2 if kind == "gated" else 1
        needed = active * T * N * K * esize * nmat + T * (K + N) * esize + masks[0].numel() * 4
        row.bandwidth_gbs = needed / (times["gemv"] * 1e-3) / 1e9
        row.bandwidth_pct_of_copy = 100.0 * row.bandwidth_gbs / report.copy_bandwidth_gbs
    return row


def measured_policy(report: Report) -> dict:
    """The `auto` thresholds these measurements support (random masks, 50 % sparsity), for policy.json.

    Every algorithm is compared with PLAIN dense (the dense model's cuBLAS op, no mask pass), per kernel
    kind: gemv_max_m[kind] is the largest T up to which the GEMV beats dense at every T' <= T, every shape
    and group size of that kind; a shape whose own crossover differs gets a gemv_max_m_shapes rule. The
    fallback (where neither GEMV nor grouped runs): measured_fallback.
    """
    from wide_export.kernels.policy import KINDS, MAX_SHAPE_RULES, shape_key

    rows = [r for r in report.rows if r.mask == "random" and abs(r.sparsity - 0.5) < 1e-9]

    def wins(r, algo):
        return algo in r.algo_ms and r.algo_ms[algo] < r.dense_ms

    def gemv_max(sel):
        best = 0
        for T in sorted({r.tokens for r in sel}):
            at = [r for r in sel if r.tokens == T]
            if not all(wins(r, "gemv") for r in at):
                break
            best = T
        return best

    from wide_export.kernels.policy import policy_for

    per_kind, rules = {}, {}
    for kind in KINDS:
        sel = [r for r in rows if r.kernel == kind]
        # a kind this run did not time keeps the value the table has for this architecture
        per_kind[kind] = gemv_max(sel) if sel else policy_for(report.arch, report.device)["gemv_max_m"][kind]
        for N, K in sorted({(r.N, r.K) for r in sel}):
            own = gemv_max([r for r in sel if (r.N, r.K) == (N, K)])
            if own != per_kind[kind] and len(rules) < MAX_SHAPE_RULES:
                rules[shape_key(kind, N, K)] = own
    tokens = sorted({r.tokens for r in rows})

    def grouped(kinds):
        best = None  # (min tokens, min group size) from which grouped beats dense everywhere above
        for gs in sorted({r.group_size for r in rows}):
            sel = [r for r in rows if r.kernel in kinds and r.group_size >= gs and "grouped" in r.algo_ms]
            for T in tokens:
                above = [r for r in sel if r.tokens >= T]
                if above and all(wins(r, "grouped") for r in above):
                    if best is None or (T, gs) < best:
                        best = (T, gs)
                    break
        return best or (1 << 30, 1 << 30)

    n_t, n_gs = grouped(("n", "gated"))
    k_t, k_gs = grouped(("k",))
    entry = {"measured": True, "device": report.device, "dtype": report.dtype, "gemv_max_m": per_kind,
             "grouped_n_min_m": n_t, "grouped_n_min_group_size": n_gs, "grouped_k_min_m": k_t,
             "grouped_k_min_group_size": k_gs,
             "prefill_tiles": measured_prefill_tiles(rows, policy_for(report.arch, report.device)["prefill_tiles"]),
             "fallback": measured_fallback(rows, entry_gemv=per_kind, rules=rules)}
    if rules:
        entry["gemv_max_m_shapes"] = rules
    return {report.arch: entry}


def measured_prefill_tiles(rows: list[Row], unmeasured: dict) -> dict:
    """prefill_tiles for policy.json: per GEMM family, at each T timed with every one of the family's size
    classes ("<algo>@<size>"), the size whose summed time over that T's rows is least; the buckets start
    with [0, "small"] (below the smallest timed T nothing was measured: the small tiles, the most CTAs)
    and change where the winner does, at most policy.MAX_TILE_BUCKETS of them (later changes are dropped:
    the last bucket then holds). A family no row timed keeps `unmeasured` (the table's buckets)."""
    from wide_export.kernels.configs import FAMILY_OF, TILE_FAMILIES
    from wide_export.kernels.policy import MAX_TILE_BUCKETS

    kind_algo = {fam: ka for ka, fam in FAMILY_OF.items()}
    out = {}
    for fam, sizes in TILE_FAMILIES.items():
        kind, algo = kind_algo[fam]
        timed = [r for r in rows if r.kernel == kind and all(f"{algo}@{z}" in r.algo_ms for z in sizes)]
        if not timed:
            out[fam] = [list(b) for b in unmeasured[fam]]
            continue
        buckets = [[0, "small"]]
        for T in sorted({r.tokens for r in timed}):
            at = [r for r in timed if r.tokens == T]
            best = min(sizes, key=lambda z: sum(r.algo_ms[f"{algo}@{z}"] for r in at))
            if best != buckets[-1][1] and len(buckets) < MAX_TILE_BUCKETS:
                buckets.append([T, best])
        out[fam] = buckets
    return out


def measured_fallback(rows: list[Row], entry_gemv: dict, rules: dict) -> str:
    """What `auto` runs where neither the GEMV nor the grouped GEMM does: "tile" (the mask fused into the
    GEMM's epilogue, one kernel) when it beat the dense fallback (cuBLAS + a mask pass) on every row timed
    with both above the GEMV's range, else "dense"."""
    from wide_export.kernels.policy import shape_key

    def past_gemv(r):
        return r.tokens > rules.get(shape_key(r.kernel, r.N, r.K), entry_gemv[r.kernel])

    both = [r for r in rows if past_gemv(r) and "tile" in r.algo_ms and "dense" in r.algo_ms]
    return "tile" if both and all(r.algo_ms["tile"] < r.algo_ms["dense"] for r in both) else "dense"


def record_policy(src: Path, dest: Optional[Path] = None) -> str:
    """Merge a measured policy-<arch>.json into policy.json (dest); returns the entries written (the
    architectures, and each one's GPU model where its name can be a key: policy.merge_recorded).
    A malformed record is refused with one WideError line and dest is left untouched."""
    from wide_export.kernels import policy as pol

    dest = dest or pol.POLICY_FILE
    hint = "record the policy-<arch>.json that `wide-export bench kernels` wrote on a GPU"
    recorded = read_record(src, hint)
    table = pol.read_table(dest)
    merged, errs = pol.merge_recorded(recorded, table)
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise WideError(f"{src} is not a valid policy record: {errs[0]}{more}", hint=hint)
    bad = pol.validate(merged)
    if bad:  # the repository's own table was already broken: do not write on top of it
        raise WideError(f"{dest} is not a valid policy table: {bad[0]}", hint="fix it by hand first")
    tmp = dest.with_suffix(".json.tmp")
    tmp.write_text(pol.dump(merged))
    tmp.replace(dest)
    pol._table.cache_clear()
    return ", ".join(k for k in merged if not k.startswith("_") and merged[k] is not table.get(k))  # the new ones


# ---------------------------------------------------------------------------
# Output
def target_checks(report: Report) -> list[tuple[str, bool, str]]:
    """The issue's targets at 50% sparsity (random masks) for what `auto` runs: (name, met, evidence)."""
    rows = [r for r in report.rows if abs(r.sparsity - 0.5) < 1e-9 and r.mask == "random"]
    out = []

    def check(name, sel, pred, fmt):
        if sel:
            worst = min(sel, key=pred)
            out.append((name, all(pred(r) >= 0 for r in sel), fmt(worst)))

    where = lambda r: f"{r.kernel} {r.shape} T={r.tokens} gs={r.group_size} {r.auto_algo}"  # noqa: E731
    check("T=1 >= 1.8x", [r for r in rows if r.tokens == 1],
          lambda r: r.speedup - 1.8, lambda r: f"worst {r.speedup:.2f}x ({where(r)})")
    check("T=1 >= 85% of copy bandwidth on active bytes", [r for r in rows if r.tokens == 1 and r.bandwidth_pct_of_copy],
          lambda r: r.bandwidth_pct_of_copy - 85, lambda r: f"worst {r.bandwidth_pct_of_copy:.0f}% ({where(r)})")
    check("never below 0.95x", report.rows, lambda r: r.speedup - 0.95,
          lambda r: f"worst {r.speedup:.2f}x ({where(r)} s={r.sparsity} {r.mask})")
    check(">= 1.5x at >= 4k tokens, gemm_n/gated, group size >= 128",
          [r for r in rows if r.tokens >= 4096 and r.group_size >= 128 and r.kernel != "k"],
          lambda r: r.speedup - 1.5, lambda r: f"worst {r.speedup:.2f}x ({where(r)})")
    check("gemm_k >= 1.0x", [r for r in rows if r.kernel == "k"],
          lambda r: r.speedup - 1.0, lambda r: f"worst {r.speedup:.2f}x ({where(r)})")
    check("outputs match the reference (rel. error <= 2e-2)", report.rows, lambda r: 2e-2 - r.max_rel_error,
          lambda r: f"worst {r.max_rel_error:.1e} ({where(r)})")
    return out


def write_json(report: Report, path: Path) -> None:
    """kernels.json, written atomically; while the run is going (complete: false) rows only, no verdicts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    data["timings_meaningful"] = report.arch != "interpreter"
    if report.arch == "interpreter" or not report.complete:  # no policy or target verdicts from these
        if report.arch == "interpreter":
            data["timings_note"] = INTERPRETER_NOTE
        data["measured_policy"] = None
        data["targets"] = []
    else:
        data["measured_policy"] = measured_policy(report)
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
    interp = report.arch == "interpreter"
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (kind, shape) in zip(axes[0], panels):
        for gs in sorted({r.group_size for r in report.rows}):
            for s in sorted({r.sparsity for r in report.rows}):
                pts = sorted((r.tokens, r.speedup) for r in report.rows
                             if (r.kernel, r.shape, r.group_size, r.sparsity, r.mask) == (kind, shape, gs, s, "random"))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"gs={gs} s={s:.0%}")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{kind} {shape}")
        ax.set_xlabel("tokens")
        ax.set_ylabel("speedup vs dense (CPU interpreter: meaningless)" if interp else "speedup vs cuBLAS")
        ax.legend(fontsize=7)
        if interp:
            ax.text(0.5, 0.5, "CPU INTERPRETER\ntimings mean nothing", transform=ax.transAxes, ha="center",
                    va="center", fontsize=14, color="red", alpha=0.35, rotation=20)
    fig.suptitle(f"WIDE kernels vs dense ({report.device}, {report.dtype})"
                 + ("\nCPU run through the Triton interpreter: the timings mean nothing" if interp else ""),
                 color="red" if interp else "black")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def speedup_table(report: Report):
    """rich Table: one row per (kernel, shape, group size, sparsity, mask), one column per token count."""
    from rich.table import Table

    tokens = sorted({r.tokens for r in report.rows})
    title = (f"speedup vs cuBLAS ({report.device}, {report.dtype}; copy bw {report.copy_bandwidth_gbs:.0f} GB/s)"
             if report.arch != "interpreter" else
             f"speedup vs torch's CPU matmul ({report.device}, {report.dtype}): INTERPRETER TIMINGS, MEANINGLESS")
    table = Table(title=title)
    for col in ("kernel", "shape", "gs", "s (realised)", "mask"):
        table.add_column(col)
    for t in tokens:
        table.add_column(str(t), justify="right")
    keys = sorted({(r.kernel, r.shape, r.group_size, r.sparsity, r.mask) for r in report.rows})
    for key in keys:
        cells = {r.tokens: r for r in report.rows if (r.kernel, r.shape, r.group_size, r.sparsity, r.mask) == key}
        vals = []
        for t in tokens:
            r = cells.get(t)
            txt = "" if r is None else f"{r.speedup:.2f} {r.auto_algo[:2]}"
            vals.append(f"[red]{txt}[/]" if r is not None and r.speedup < 0.95 else txt)
        realised = 1.0 - sum(r.active_weight_fraction for r in cells.values()) / len(cells)
        table.add_row(key[0], key[1], str(key[2]), f"{key[3]:.2g} ({realised:.2f})", key[4], *vals)
    return table


def _si(v: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def _time(ms: float) -> str:
    return f"{ms:.3g} ms" if ms >= 1 else (f"{ms * 1e3:.3g} us" if ms >= 1e-3 else f"{ms * 1e6:.3g} ns")


def roofline_table(report: Report):
    """rich Table: per case the bytes and FLOPs it needs, the time they take at the roofline, and `auto`'s share."""
    from rich import box
    from rich.table import Table

    interp = report.arch == "interpreter"
    rows = report.rows
    if len(rows) > 200:  # the full preset: random masks at 50 % only
        rows = [r for r in rows if r.mask == "random" and abs(r.sparsity - 0.5) < 1e-9]
    title = (f"roofline ({report.roofline_basis}: {report.roofline_copy_gbs:.0f} GB/s, "
             f"{report.tensor_tflops:.0f} TFLOP/s)" if not interp else
             f"roofline at {report.roofline_basis}; % of it: n/m, CPU interpreter timings mean nothing")
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("case", overflow="fold")
    for col in ("bytes", "FLOPs", "limit", "auto", "% of limit"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in sorted(rows, key=lambda r: (r.kernel, r.shape, r.group_size, r.sparsity, r.mask, r.tokens)):
        case = f"{r.kernel} {r.shape} gs{r.group_size} T={r.tokens}"
        case += f" s={r.sparsity:g} ({1.0 - r.active_weight_fraction:.2f} realised)"
        if r.mask != "random":
            case += f" {r.mask}"
        pct = "n/m" if r.pct_of_roofline is None else f"{r.pct_of_roofline:.0f}%"
        table.add_row(case, _si(r.bytes_needed, "B"), _si(r.flops, ""), _time(r.roofline_ms),
                      f"{r.auto_algo} {_time(r.wide_ms)}", pct)
    return table
