"""`wide-export bench ...`: benchmarks (numbers and plots, never pass/fail tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors

bench_app = typer.Typer(help="Benchmarks that print numbers, tables and plots.", no_args_is_help=True)


@bench_app.command("export")
@user_errors
def bench_export(
    preset: Annotated[str, typer.Option(help="Model shape: llama-3.2-1b or tiny.")] = "llama-3.2-1b",
    layers: Annotated[Optional[int], typer.Option(help="Override the layer count (quicker runs).")] = None,
    output: Annotated[Path, typer.Option(help="Where to write the JSON results.")] = Path("bench-results/export.json"),
) -> None:
    """Time the WIDE export and its peak RSS next to a plain dense torch.onnx export."""
    from wide_export.bench.export import run_export_bench

    run_export_bench(preset=preset, layers=layers, output=output)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
