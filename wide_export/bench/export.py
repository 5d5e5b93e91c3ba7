"""`wide-export bench export`: export time and peak RSS, WIDE export vs a plain dense export.

Each export runs in its own subprocess so peak RSS (ru_maxrss) belongs to that
export alone. The dense baseline is the same model without routers, traced by
the same torch.onnx.export(dynamo=True) and saved as it comes (no `wide` ops,
no function bodies, no verification).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from wide_export.errors import WideError
from wide_export.model.synthetic import SyntheticSpec

PRESETS = {
    # Llama-3.2-1B dimensions (tied embeddings, GQA 32/8, head_dim 64), WIDE routers:
    # 16 attention groups (ATTN_G = 2), 64 FFN groups (FFN_G = 128), rank 128.
    "llama-3.2-1b": SyntheticSpec(arch="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                                  num_layers=16, num_heads=32, num_kv_heads=8, attn_groups=16, ffn_groups=64,
                                  rank=128, tie_word_embeddings=True, max_position_embeddings=131072),
    "tiny": SyntheticSpec(arch="llama", num_layers=3),
}


def _spec(preset: str, layers: int | None) -> SyntheticSpec:
    if preset not in PRESETS:
        raise WideError(f"unknown preset {preset!r}", f"choose one of {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    if layers is not None:
        spec = SyntheticSpec(**{**spec.__dict__, "num_layers": layers})
    return spec


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(kind: str, preset: str, layers: int | None, out: str) -> dict[str, Any]:
    """Build the model, export it, return timings and memory (runs in the child process)."""
    import torch

    from wide_export.checkpoint.loader import LoadedModel
    from wide_export.model.build import model_from_states
    from wide_export.model.synthetic import random_base_state, random_router_state

    spec = _spec(preset, layers)
    t0 = time.perf_counter()
    routers = random_router_state(spec) if kind == "wide" else {}
    model = model_from_states(spec.hf_config(), random_base_state(spec), routers)
    params = sum(p.numel() for p in model.parameters())
    build_s, rss_model = time.perf_counter() - t0, _rss_mb()
    t1 = time.perf_counter()
    if kind == "wide":
        from wide_export.export.onnx_export import export_onnx

        export_onnx(LoadedModel(model, is_demo=False), Path(out))
    else:
        from wide_export.export.onnx_export import _trace

        program = _trace(model, 20)
        Path(out).mkdir(parents=True)
        program.save(str(Path(out) / "model.onnx"), external_data=True)
    export_s = time.perf_counter() - t1
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    del torch
    return {"kind": kind, "params": params, "build_s": build_s, "export_s": export_s,
            "rss_after_build_mb": rss_model, "peak_rss_mb": _rss_mb(), "output_mb": size / 2**20}


def run_export_bench(preset: str = "llama-3.2-1b", layers: int | None = None,
                     output: Path = Path("bench-results/export.json")) -> list[dict[str, Any]]:
    """Run the WIDE and the dense export in fresh processes; print a table, write JSON."""
    import tempfile

    from rich.console import Console
    from rich.table import Table

    _spec(preset, layers)
    console = Console(stderr=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wide-bench-") as tmp:
        for kind in ("wide", "dense"):
            with console.status(f"exporting the {kind} model ({preset}) in a fresh process ..."):
                cmd = [sys.executable, "-m", "wide_export.bench.export", kind, preset, str(layers or 0),
                       str(Path(tmp) / kind)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{kind} export failed:\n{proc.stderr[-3000:]}")
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            console.print(f"[green]✓[/] {kind}: {rows[-1]['export_s']:.1f} s")
    table = Table(title=f"export benchmark: {preset}" + (f", {layers} layers" if layers else ""))
    for col in ("export", "params", "build s", "export s", "RSS after build", "peak RSS", "output"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["kind"], f"{r['params'] / 1e6:,.1f} M", f"{r['build_s']:.1f}", f"{r['export_s']:.1f}",
                      f"{r['rss_after_build_mb'] / 1024:.2f} GiB", f"{r['peak_rss_mb'] / 1024:.2f} GiB",
                      f"{r['output_mb']:,.1f} MiB")
    console.print(table)
    wide, dense = rows
    console.print(f"WIDE / dense: export time x{wide['export_s'] / dense['export_s']:.2f}, "
                  f"peak RSS x{wide['peak_rss_mb'] / dense['peak_rss_mb']:.2f}")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"preset": preset, "layers": layers, "runs": rows}, indent=2) + "\n")
    console.print(f"results: {output}")
    return rows


if __name__ == "__main__":  # worker entry: kind preset layers out
    _kind, _preset, _layers, _out = sys.argv[1:5]
    print(json.dumps(worker(_kind, _preset, int(_layers) or None, _out)))
