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
    preset: Annotated[str, typer.Option(help="Model shape: llama-3.2-1b, llama-3.1-8b or tiny.")] = "llama-3.2-1b",
    layers: Annotated[Optional[list[int]], typer.Option(help="Depths to sweep (repeat the option); default "
                                                       "4, 8, 16 for llama-3.2-1b, else the preset's.")] = None,
    dense: Annotated[bool, typer.Option("--dense/--no-dense", help="Also export the checkpoint densely with "
                                        "torch.onnx.export (holds every weight: skip it at 8B).")] = True,
    work_dir: Annotated[Optional[Path], typer.Option(help="Existing folder where the checkpoints are written "
                                                     "(GBs; default the system temp folder); removed again at "
                                                     "the end, also on Ctrl-C or SIGTERM.")] = None,
    output: Annotated[Path, typer.Option(help="JSON results (the plot goes beside it, .png).")] = Path(
        "bench-results/export.json"),
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Also time `wide-export verify --sliced` "
                                         "on each WIDE export, with its peak RSS and verdict.")] = False,
) -> None:
    """Time `wide-export onnx` on checkpoints written to disk, with its peak RSS, next to a dense export."""
    from wide_export.bench.export import KINDS, run_export_bench

    run_export_bench(preset=preset, layers=layers, kinds=KINDS if dense else ("wide",), output=output,
                     work_dir=work_dir, verify=verify)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
