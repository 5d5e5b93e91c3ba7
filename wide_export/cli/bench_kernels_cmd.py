"""`wide-export bench kernels`: the WIDE Triton kernels vs dense cuBLAS (GPU; `--preset tiny` on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wide_export.cli.common import user_errors


@user_errors
def bench_kernels(
    preset: Annotated[str, typer.Option(help="Grid to run: 'short' (minutes, Llama-3.1-8B shapes), 'full' "
                                             "(tokens 1..16384, group sizes 32/128/512, sparsity 25/50/75 %, "
                                             "random and correlated masks, Llama-3.1-8B and Qwen3-8B) or 'tiny' "
                                             "(CPU interpreter smoke run; timings mean nothing).")] = "short",
    dtype: Annotated[str, typer.Option(help="Activation/weight dtype: fp16 or bf16.")] = "fp16",
    output: Annotated[Path, typer.Option(help="Folder for kernels.json, kernels.png and policy-<arch>.json.")]
    = Path("bench-results"),
    seed: Annotated[int, typer.Option(help="Seed of the random inputs and masks.")] = 0,
) -> None:
    """Time every masked-GEMM algorithm against cuBLAS on Llama-3.1-8B / Qwen3-8B shapes; table, JSON, PNG.

    Also writes the `auto` thresholds these timings support as policy-<arch>.json:
    merge it into wide_export/kernels/policy.json to make them the default on that GPU.
    """
    import json

    from rich.console import Console

    from wide_export.bench.kernels import (measured_policy, run_kernel_bench, speedup_table, target_checks,
                                           write_json, write_plot)

    console = Console(highlight=False)
    with console.status("benchmarking") as status:
        report = run_kernel_bench(preset=preset, dtype=dtype, seed=seed, progress=status.update)
    json_path, png_path = output / "kernels.json", output / "kernels.png"
    write_json(report, json_path)
    plotted = write_plot(report, png_path)
    console.print(speedup_table(report))
    if report.arch == "interpreter":
        # CPU timings of the interpreter say nothing about the kernels: no targets, no policy from them.
        console.print("[yellow]CPU run through the Triton interpreter: the timings mean nothing; targets not "
                      "checked and no auto policy written (run it on a GPU for those)[/]")
    else:
        policy = measured_policy(report)
        policy_path = output / f"policy-{report.arch}.json"
        policy_path.write_text(json.dumps(policy, indent=2) + "\n")
        for name, ok, evidence in target_checks(report):
            console.print(f"{'[green]met[/]' if ok else '[red]missed[/]'}  {name}: {evidence}")
        console.print(f"measured auto policy: {policy_path}")
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else
                                              " (no plot: install the `bench` extra for matplotlib)"))

def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("kernels")(bench_kernels)
