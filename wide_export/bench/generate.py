"""`wide-export bench generate`: generation on CPU, WIDE against the dense model people run there, on the same
weights in one run: llama.cpp (llama-cpp-python) on a GGUF of the checkpoint (export/gguf.py), our own
dense path (every group executed), and WIDE at each sparsity (bench/routers.py sets a preset's random
routers to it), through wide_export.generation.cpu_generator.

Each runner is timed on the same prompts (random ids, one length per run, `batch` rows decoded together):
prefill = the prompt's forward and the first token, decode = the later tokens. Bytes per decode token are the
weights one token reads (bench/common.decode_bytes: WIDE's routed projections scaled by the executed fraction
measured on random tokens); GB/s = those bytes x decode steps per second.
"""

from __future__ import annotations

import gc
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from wide_export.base.errors import WideError

# the dtypes the CPU path runs -> bytes per weight (llama.cpp's GGUF types of each: bench/llamacpp.GGUF_TYPES)
DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Row:
    runner: str  # "llama.cpp f32", "ours dense", "WIDE s=0.50"
    sparsity: Optional[float]  # WIDE's measured skipped fraction (mean of attention and FFN); None: dense
    batch: int
    prompt_len: int
    prefill_tok_s: float
    decode_tok_s: float
    bytes_per_token: int  # weight bytes one decode step reads (batch 1; a batch shares them, each row's union)
    decode_gbs: float
    tokens: list = field(default_factory=list)  # the first row's first 8 greedy tokens


@dataclass
class GenBench:
    cpu: str
    threads: int
    dtype: str
    model: str
    new: int
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sparsity: dict = field(default_factory=dict)  # requested -> {kind: measured skipped fraction}

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [asdict(r) for r in self.rows]}


def _prompts(vocab: int, batch: int, length: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=gen).tolist()


def _ours(ckpt: Path, dtype: str, dense: bool, cases, new: int, threads: int, say) -> list[tuple]:
    """(case, Generated) per case, one model load; a short warm-up run first."""
    from wide_export.generation.cpu_generator import CpuGenerator

    gen = CpuGenerator.load(ckpt, dtype=dtype, dense=dense, threads=threads)
    gen.run([[5] * 8], 4, stop_at_eos=False)  # warm-up: kernels loaded, allocator and caches filled
    out = []
    for case in cases:
        say(f"{'dense' if dense else 'WIDE'}: batch {case[0]}, prompt {case[1]}")
        out.append((case, gen.run(case[2], new, stop_at_eos=False)))
    del gen
    gc.collect()
    return out


def _llamacpp(gguf: Path, cases, new: int, threads: int, say) -> list[tuple]:
    from wide_export.bench.llamacpp import run_llamacpp

    out = []
    for case in cases:
        say(f"llama.cpp: batch {case[0]}, prompt {case[1]}")
        out.append((case, run_llamacpp(gguf, case[2], new, n_threads=threads)))
    return out


def run_generate_bench(model: Optional[Path] = None, *, preset: str = "llama-0.4b", dtype: str = "float32",
                       sparsities=(0.0, 0.25, 0.5, 0.75), batches=(1, 4), prompt_lens=(128, 1024), new: int = 32,
                       threads: Optional[int] = None, llamacpp: bool = True, seed: int = 0,
                       progress: Optional[Callable[[str], None]] = None) -> GenBench:
    import torch

    from wide_export.bench.common import MODEL_PRESETS, decode_bytes
    from wide_export.bench.routers import calibrate, measure
    from wide_export.checkpoint import load_wide_model
    from wide_export.cpu import ops
    from wide_export.model.synthetic import write_checkpoint

    say = progress or (lambda _m: None)
    if dtype not in DTYPES:
        raise WideError(f"--dtype {dtype}: the CPU kernels take {', '.join(DTYPES)}", "choose one of those")
    if model is None and preset not in MODEL_PRESETS:
        raise WideError(f"unknown --preset {preset}", f"choose one of {', '.join(MODEL_PRESETS)}, or --model DIR")
    if model is not None and tuple(sparsities) != (None,):
        raise WideError("--sparsity sets a preset's random routers; a checkpoint's routers are its own",
                        "drop --sparsity with --model (its routers are timed as they are)")
    if new < 2 or not batches or min(batches) < 1 or not prompt_lens or min(prompt_lens) < 1:
        raise WideError("--new must be >= 2, --batch and --prompt-len >= 1", "e.g. --batch 1 --prompt-len 128")
    if any(s is not None and not 0 <= s < 1 for s in sparsities):
        raise WideError(f"--sparsity {list(sparsities)}: each must be in [0, 1)", "e.g. --sparsity 0.5")
    ops.require(", so WIDE would be timed on the dense path")
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    itemsize = DTYPES[dtype]
    with tempfile.TemporaryDirectory(prefix="wide-bench-generate-") as tmp:
        work = Path(tmp)
        if model is None:
            say(f"writing the {preset} preset checkpoint")
            ckpt = write_checkpoint(work / "ckpt", MODEL_PRESETS[preset])
        else:
            ckpt = Path(model)
        cfg = load_wide_model(ckpt, lazy=True, checksums=False).config
        report = GenBench(cpu=ops.cpu_model(), threads=threads, dtype=dtype,
                          model=f"preset {preset}" if model is None else str(model), new=new)
        cases = [(b, p, _prompts(cfg.vocab_size, b, p, seed + 7 * b + p)) for p in prompt_lens for b in batches]
        if max(prompt_lens) + new > cfg.max_position_embeddings:
            raise WideError(f"--prompt-len {max(prompt_lens)} + --new {new} exceed the model's "
                            f"{cfg.max_position_embeddings} positions", "lower --prompt-len or --new")
        dense_bytes = decode_bytes(cfg, itemsize, {})

        def add(runner: str, sparsity, results, nbytes: int):  # results: LlamaCppRun or Generated per case
            for (b, p, _), r in results:
                report.rows.append(Row(runner, sparsity, b, p, r.prefill_tok_s, r.decode_tok_s, nbytes,
                                       nbytes * r.decode_tok_s / b / 1e9, r.tokens[0][:8]))

        if llamacpp:
            from wide_export.bench.llamacpp import for_checkpoint

            runs, why = for_checkpoint(ckpt, dtype, work, lambda gguf: _llamacpp(gguf, cases, new, threads, say), say)
            if why:
                report.notes.append(why)
            for runner, results in runs.items():
                add(runner, None, results, dense_bytes)
        add("ours dense", None, _ours(ckpt, dtype, True, cases, new, threads, say), dense_bytes)
        original = (ckpt / "router.pth").read_bytes() if model is None else None
        for s in sparsities:
            if s is not None:  # calibrate() measures the calibrated routers itself: no second load
                say(f"routers at sparsity {s}")
                (ckpt / "router.pth").write_bytes(original)
                skipped = calibrate(ckpt, s)
            else:
                skipped = measure(load_wide_model(ckpt, dtype="float32", checksums=False).model)
            gc.collect()
            label = f"WIDE s={s:.2f}" if s is not None else "WIDE"
            report.sparsity[label] = skipped
            mean = sum(skipped.values()) / max(len(skipped), 1)
            add(label, mean, _ours(ckpt, dtype, False, cases, new, threads, say), decode_bytes(cfg, itemsize, skipped))
        if model is None:
            shutil.rmtree(work / "ckpt", ignore_errors=True)
    return report


def same_tokens(report: GenBench) -> Optional[bool]:
    """Whether our dense path's greedy tokens equal llama.cpp's in every case (None: no llama.cpp rows)."""
    pairs = [(r, next((x for x in report.rows if x.runner == "ours dense" and (x.batch, x.prompt_len) ==
                       (r.batch, r.prompt_len)), None)) for r in report.rows if r.runner.startswith("llama.cpp")]
    return all(o is not None and o.tokens == r.tokens for r, o in pairs) if pairs else None


def table(report: GenBench):
    from rich.table import Table

    t = Table(title=f"Generation on {report.cpu}, {report.threads} threads, {report.dtype}, {report.model}, "
                    f"{report.new} new tokens")
    for col in ("runner", "batch", "prompt", "prefill tok/s", "decode tok/s", "vs llama.cpp", "vs ours dense",
                "MB / token", "GB/s"):
        t.add_column(col, justify="right" if col != "runner" else "left")
    for r in report.rows:
        base = {name: next((x for x in report.rows if x.runner.startswith(name) and x.batch == r.batch
                            and x.prompt_len == r.prompt_len), None) for name in ("llama.cpp", "ours dense")}
        ratio = {k: (f"{r.decode_tok_s / v.decode_tok_s:.2f}x" if v and v.decode_tok_s else "") for k, v in
                 base.items()}
        t.add_row(r.runner, str(r.batch), str(r.prompt_len), f"{r.prefill_tok_s:.1f}", f"{r.decode_tok_s:.2f}",
                  ratio["llama.cpp"], ratio["ours dense"], f"{r.bytes_per_token / 1e6:.0f}", f"{r.decode_gbs:.1f}")
    return t


def write_outputs(report: GenBench, folder: Path) -> tuple[Path, Optional[Path]]:
    from wide_export.bench.common import pyplot

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "generate.json"
    path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    plt = pyplot()
    if plt is None:
        return path, None
    combos = sorted({(r.batch, r.prompt_len) for r in report.rows})
    runners = list(dict.fromkeys(r.runner for r in report.rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(runners)
    for ax, metric, label in ((axes[0], "decode_tok_s", "decode tokens/s"), (axes[1], "prefill_tok_s",
                                                                            "prefill tokens/s")):
        for i, name in enumerate(runners):
            vals = [next((getattr(r, metric) for r in report.rows if r.runner == name and (r.batch, r.prompt_len)
                          == c), 0.0) for c in combos]
            ax.bar([j + i * width for j in range(len(combos))], vals, width, label=name)
        ax.set_xticks([j + width * (len(runners) - 1) / 2 for j in range(len(combos))],
                      [f"b{b} p{p}" for b, p in combos])
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{report.cpu}, {report.threads} threads, {report.dtype}", fontsize=9)
    fig.tight_layout()
    png = folder / "generate.png"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return path, png
