"""`wide-export bench export`: the user's path -- a checkpoint on disk to an ONNX folder -- timed and measured.

For each depth of the sweep, a random-weight checkpoint of that shape is written
to disk (bfloat16 safetensors shards + router.pth, as the trainer ships them),
then exported in a fresh process, so that process's peak RSS (wait4's
ru_maxrss) belongs to that export alone:
  * wide:  `wide-export onnx --model CKPT --dtype float16 --no-verify`, the real
    command (streaming weights, routers, `wide` ops, function bodies);
  * dense: the same checkpoint loaded eagerly without routers and exported as a
    user would with `torch.onnx.export(dynamo=True)` + `save(external_data=True)`.
With `verify=True` (`--verify`), the WIDE export is then checked as a user would,
`wide-export verify --onnx OUT --sliced` in a fresh process (one layer slice of
ONNX Runtime at a time against a reference reading its weights module by module),
and that run's time, peak RSS and verdict make a "verify" row.
Wall time includes start-up and loading. The table, the JSON and a plot (time
and peak RSS against weight bytes) show how both grow with the model.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError
from wide_export.model.synthetic import SyntheticSpec

PRESETS = {
    # Llama-3.2-1B dimensions (tied embeddings, GQA 32/8, head_dim 64), WIDE routers:
    # 16 attention groups (ATTN_G = 2), 64 FFN groups (FFN_G = 128), rank 128.
    "llama-3.2-1b": SyntheticSpec(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                  num_layers=16, num_heads=32, num_kv_heads=8, attn_groups=16, ffn_groups=64,
                                  rank=128, tie_word_embeddings=True, max_position_embeddings=131072),
    # Llama-3.1-8B dimensions (untied, GQA 32/8, head_dim 128): 16 attention groups, 112 FFN groups.
    "llama-3.1-8b": SyntheticSpec(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                  num_layers=32, num_heads=32, num_kv_heads=8, attn_groups=16, ffn_groups=112,
                                  rank=128, tie_word_embeddings=False, max_position_embeddings=131072),
    "tiny": SyntheticSpec(arch="llama", num_layers=3),
}
DEFAULT_SWEEP = {"llama-3.2-1b": [4, 8, 16]}  # layers; other presets: their own depth
KINDS = ("wide", "dense")
DTYPE = "float16"


def spec_for(preset: str, layers: int | None = None) -> SyntheticSpec:
    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", f"choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    if layers is not None:
        if layers < 1:
            raise WideError(f"--layers {layers} must be at least 1", "pass a positive layer count")
        spec = replace(spec, num_layers=layers)
    return spec


# Starts the measured command from a small process: a child's ru_maxrss counts the RSS its parent had at fork
# (Linux keeps the high-water mark across exec), so forking the command from this (maybe large) process would
# report this process's RSS for a small export. The launcher writes the command's exit status and peak RSS.
_LAUNCHER = """import json, os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}, f)
"""


def _run(cmd: list[str], check: bool = True) -> dict[str, Any]:
    """Run `cmd`: wall seconds and the peak RSS of that process alone (started by _LAUNCHER).
    check=False accepts exit 1 (a verification that ran and failed)."""
    from wide_export.base import childproc

    with tempfile.TemporaryFile("w+") as log, tempfile.NamedTemporaryFile("r", suffix=".json") as report:
        start = time.perf_counter()
        # Its own process group: Ctrl-C / SIGTERM of the benchmark stops it (and what it started) before the
        # temp folder it writes into is removed.
        proc = childproc.start([sys.executable, "-c", _LAUNCHER, report.name, *cmd], stdout=subprocess.DEVNULL,
                               stderr=log)
        try:
            proc.wait()
        except BaseException:
            childproc.stop_group(proc)
            raise
        seconds = time.perf_counter() - start
        try:
            measured = json.loads(Path(report.name).read_text())
        except (OSError, ValueError):
            measured = {"code": proc.returncode or 1, "maxrss_kb": 0}
        code = measured["code"]
        if code and (check or code != 1):
            log.seek(0)
            raise RuntimeError(f"{' '.join(cmd[1:5])} ... failed (exit {code}):\n{log.read()[-3000:]}")
    return {"seconds": seconds, "peak_rss_mb": measured["maxrss_kb"] / 1024}


def _dense_worker(ckpt: str, out: str) -> None:
    """The dense baseline (runs in its own process): eager load without routers, torch.onnx.export, save."""
    import torch

    from wide_export.checkpoint.hf import iter_tensors, read_hf_config, safetensors_files
    from wide_export.export.onnx_export import trace_program
    from wide_export.model.build import build_model
    from wide_export.model.config import WideConfig

    hf = read_hf_config(Path(ckpt))
    cfg = WideConfig.from_hf(hf)
    model = build_model(hf, cfg, iter_tensors(safetensors_files(Path(ckpt))), {}, torch.float16)
    program = trace_program(model, 20)
    Path(out).mkdir(parents=True)
    program.save(str(Path(out) / "model.onnx"), external_data=True)


def export_once(kind: str, ckpt: Path, out: Path) -> dict[str, Any]:
    if kind == "wide":
        cmd = [sys.executable, "-m", "wide_export", "onnx", "--model", str(ckpt), "--output", str(out),
               "--dtype", DTYPE, "--no-verify"]
    else:
        cmd = [sys.executable, "-m", "wide_export.bench.export", "dense", str(ckpt), str(out)]
    row = _run(cmd)
    row["output_mb"] = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    return row


def verify_once(out: Path) -> dict[str, Any]:
    """`wide-export verify --onnx OUT --sliced` in a fresh process: time, peak RSS and the verdict."""
    row = _run([sys.executable, "-m", "wide_export", "verify", "--onnx", str(out), "--sliced"], check=False)
    from wide_export.base.names import VERIFY_REPORT

    report = json.loads((out / VERIFY_REPORT).read_text())
    row.update(output_mb=0.0, passed=bool(report["passed"]), notes=report["notes"])
    return row


def _weights_mb(ckpt: Path) -> tuple[float, float]:
    """(all weight bytes, largest single tensor) in MiB, in the export dtype (2 bytes an element)."""
    from wide_export.checkpoint.tensor_reader import ShardReader

    total = largest = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        for key, info in ShardReader(f).header.items():
            if key != "__metadata__":
                n = 2 * math.prod(info["shape"])
                total, largest = total + n, max(largest, n)
    return total / 2**20, largest / 2**20


def run_export_bench(preset: str = "llama-3.2-1b", layers: list[int] | None = None, kinds=KINDS,
                     output: Path = Path("bench-results/export.json"), work_dir: Path | None = None,
                     console=None, verify: bool = False) -> list[dict[str, Any]]:
    """Write each checkpoint of the sweep, export it with each kind, print a table, write JSON and a plot."""
    from rich.console import Console

    depths = layers or DEFAULT_SWEEP.get(preset) or [spec_for(preset).num_layers]
    specs = [spec_for(preset, n) for n in depths]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise WideError(f"unknown export kind {bad[0]!r}", f"choose from {', '.join(KINDS)}")
    if work_dir is not None and not Path(work_dir).is_dir():
        raise WideError(f"--work-dir {work_dir} is not a folder",
                        "create it first, or leave --work-dir out to use the system temp folder")
    console = console or Console(stderr=True)
    tmp = tempfile.mkdtemp(prefix="wide-bench-", dir=work_dir)
    try:
        rows = _sweep(console, tmp, preset, specs, kinds, verify)
    except KeyboardInterrupt:
        from wide_export.base.signals import Interrupted, shielded

        with shielded():
            shutil.rmtree(tmp, ignore_errors=True)
        raise Interrupted(f"stopped the export in progress and removed {tmp}; no results were written") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _table(console, preset, rows)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"preset": preset, "dtype": DTYPE, "cpus": os.cpu_count(), "runs": rows},
                                 indent=2) + "\n")
    console.print(f"results: {output}")
    plot = plot_results(rows, output.with_suffix(".png"))
    if plot:
        console.print(f"plot: {plot}")
    return rows


def _sweep(console, tmp: str, preset: str, specs, kinds, verify: bool) -> list[dict[str, Any]]:
    from wide_export.base.progress import status

    rows: list[dict[str, Any]] = []
    for spec in specs:
        ckpt = Path(tmp) / f"ckpt-{spec.num_layers}"
        with status(console, f"writing a {preset} checkpoint with {spec.num_layers} layers ..."):
            # in a child process: this one stays small, for a child's ru_maxrss counts the RSS it
            # inherited at fork (Linux keeps the pre-exec high-water mark)
            _run([sys.executable, "-m", "wide_export.bench.export", "checkpoint", preset,
                  str(spec.num_layers), str(ckpt)])
        weights_mb, largest_mb = _weights_mb(ckpt)
        for kind in kinds:
            out = Path(tmp) / f"{kind}-{spec.num_layers}"
            with status(console, f"{kind} export, {spec.num_layers} layers, in a fresh process ..."):
                row = export_once(kind, ckpt, out)
            row.update(kind=kind, preset=preset, layers=spec.num_layers, weights_mb=weights_mb,
                       largest_tensor_mb=largest_mb)
            rows.append(row)
            console.print(f"[green]✓[/] {kind:<5} {spec.num_layers:>3} layers: {row['seconds']:6.1f} s, "
                          f"peak RSS {row['peak_rss_mb'] / 1024:.2f} GiB")
            if verify and kind == "wide":
                with status(console, f"verifying the {spec.num_layers}-layer export, sliced, in a fresh "
                                    "process ..."):
                    check = verify_once(out)
                check.update(kind="verify", preset=preset, layers=spec.num_layers, weights_mb=weights_mb,
                             largest_tensor_mb=largest_mb)
                rows.append(check)
                console.print(f"{'[green]✓[/]' if check['passed'] else '[red]✗[/]'} verify "
                              f"{spec.num_layers:>3} layers: {check['seconds']:6.1f} s, peak RSS "
                              f"{check['peak_rss_mb'] / 1024:.2f} GiB, "
                              f"{'PASSED' if check['passed'] else 'FAILED'}")
            shutil.rmtree(out)
        shutil.rmtree(ckpt)
    return rows


def _size(mb: float) -> str:
    return f"{mb / 1024:.2f} GiB" if mb >= 1024 else f"{mb:.1f} MiB"


def _table(console, preset: str, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title=f"export of a {preset}-shaped checkpoint on disk ({DTYPE}, {os.cpu_count()} CPUs)")
    for col in ("export", "layers", "weights", "largest tensor", "time", "peak RSS", "RSS - largest", "output"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["kind"], str(r["layers"]), _size(r["weights_mb"]), _size(r["largest_tensor_mb"]),
                      f"{r['seconds']:.1f} s", _size(r["peak_rss_mb"]),
                      _size(r["peak_rss_mb"] - r["largest_tensor_mb"]),
                      _size(r["output_mb"]) if r["kind"] != "verify" else ("passed" if r["passed"] else "FAILED"))
    console.print(table)


def plot_results(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Time and peak RSS against weight size, one line per export kind (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    if len({r["layers"] for r in rows}) == 1:  # one model size: a line through one point says nothing; bars do
        return _plot_bars(plt, fig, ax_t, ax_m, rows, path)
    for kind in (*KINDS, "verify"):
        rs = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["weights_mb"])
        if not rs:
            continue
        x = [r["weights_mb"] / 1024 for r in rs]
        ax_t.plot(x, [r["seconds"] for r in rs], "o-", label=kind)
        ax_m.plot(x, [r["peak_rss_mb"] / 1024 for r in rs], "o-", label=kind)
        for r, xi in zip(rs, x):
            ax_t.annotate(f"{r['layers']}L", (xi, r["seconds"]), fontsize=7)
    sizes = sorted({r["weights_mb"] / 1024 for r in rows})
    ax_m.plot(sizes, sizes, ":", color="grey", label="weights")
    ax_t.set(xlabel="weights (GiB, fp16)", ylabel="export time (s)", title="time")
    ax_m.set(xlabel="weights (GiB, fp16)", ylabel="peak RSS (GiB)", title="memory")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _plot_bars(plt, fig, ax_t, ax_m, rows: list[dict[str, Any]], path: Path) -> Path:
    """One bar per run (export kind, verify) for time and peak RSS, the weight size as a reference line."""
    names = [r["kind"] for r in rows]
    colors = [f"C{i}" for i in range(len(rows))]
    ax_t.bar(names, [r["seconds"] for r in rows], color=colors)
    ax_m.bar(names, [r["peak_rss_mb"] / 1024 for r in rows], color=colors)
    weights = rows[0]["weights_mb"] / 1024
    ax_m.axhline(weights, ls=":", color="grey", label=f"weights {_size(rows[0]['weights_mb'])}")  # tiny: MiB
    ax_m.legend()
    ax_t.set(ylabel="time (s)", title=f"time, {rows[0]['layers']} layers")
    ax_m.set(ylabel="peak RSS (GiB)", title="memory")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


if __name__ == "__main__":  # workers: `dense CKPT OUT` or `checkpoint PRESET LAYERS DIR`
    if sys.argv[1] == "dense":
        _dense_worker(sys.argv[2], sys.argv[3])
    else:
        from wide_export.bench.checkpoint_files import write_sharded_checkpoint

        write_sharded_checkpoint(Path(sys.argv[4]), spec_for(sys.argv[2], int(sys.argv[3])))
