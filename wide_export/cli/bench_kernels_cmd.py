"""`wide-export bench kernels`: WIDE CUDA kernels vs dense cuBLAS (GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wide_export.cli.common import user_errors


@user_errors
def bench_kernels(
    preset: Annotated[str, typer.Option(help="Grid to run: 'short' (minutes) or 'full' (tokens 1..16384, "
                                             "G 32/128, sparsity 0.3/0.5/0.7).")] = "short",
    dtype: Annotated[str, typer.Option(help="Activation/weight dtype: fp16 or bf16.")] = "fp16",
    output: Annotated[Path, typer.Option(help="Folder for kernels.json and kernels.png.")] = Path("bench-results"),
    seed: Annotated[int, typer.Option(help="Seed of the random inputs and masks.")] = 0,
) -> None:
    """Time the masked GEMMs against torch.matmul on Llama-3.1-8B shapes; table, JSON and PNG."""
    from rich.console import Console

    from wide_export.bench.kernels import run_kernel_bench, speedup_table, target_checks, write_json, write_plot

    console = Console(highlight=False)
    with console.status("benchmarking") as status:
        report = run_kernel_bench(preset=preset, dtype=dtype, seed=seed, progress=status.update)
    json_path, png_path = output / "kernels.json", output / "kernels.png"
    write_json(report, json_path)
    plotted = write_plot(report, png_path)
    console.print(speedup_table(report))
    for name, ok, evidence in target_checks(report):
        console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {evidence}")
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else
                                              " (no plot: install the `bench` extra for matplotlib)"))


def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("kernels")(bench_kernels)
