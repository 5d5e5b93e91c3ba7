"""`wide-export bench kernels`: the WIDE Triton kernels vs dense cuBLAS (GPU; `--preset tiny` on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors


@user_errors
def bench_kernels(
    preset: Annotated[str, typer.Option(help="Grid to run: 'short' (minutes, Llama-3.1-8B shapes), 'full' "
                                             "(tokens 1..16384, group sizes 32/128/512, sparsity 25/50/75 %, "
                                             "random and correlated masks, Llama-3.1-8B and Qwen3-8B) or 'tiny' "
                                             "(CPU interpreter smoke run; timings mean nothing); --device cpu "
                                             "also 'llama-0.4b' (the generation benchmarks' model).")] = "short",
    dtype: Annotated[Optional[str], typer.Option(help="Activation/weight dtype: bf16 or fp16 (GPU; default bf16); "
                                                      "fp32, bf16 or fp16 (--device cpu; default fp32 and bf16).",
                                                 show_default=False)] = None,
    device: Annotated[str, typer.Option(help="cpu: the compiled CPU kernels (wide_export.cpu) against torch's "
                                             "dense GEMM, real timings; gpu: the Triton kernels against cuBLAS "
                                             "(--preset tiny runs them on CPU through the interpreter); auto: gpu.")]
    = "auto",
    output: Annotated[Path, typer.Option(help="Folder for kernels.json (rewritten after every case), kernels.png "
                                              "and policy-<arch>.json.")] = Path("bench-results"),
    seed: Annotated[int, typer.Option(help="Seed of the random inputs and masks.")] = 0,
    record: Annotated[Optional[Path], typer.Option(
        "--record", metavar="FILE", help="Run nothing: merge a measured policy-<arch>.json (written by a GPU run "
                                         "of this command) into wide_export/kernels/policy.json, after checking "
                                         "it against the policy schema.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the options, import the kernels and list "
                                                            "the cases, then stop before the first CUDA call "
                                                            "(scripts/gpu-check.sh's CI dry run).")] = False,
    attention: Annotated[str, typer.Option(help="Also time attention that skips head groups against SDPA: 'all' "
                                               "(prefill 4k / 16k, decode at batch 1 / 16 / 64 over 4k / 32k), "
                                               "'short' (prefill 4k, decode batch 16 over 4k) or 'none'; tiny cases "
                                               "through the interpreter on CPU. Rows: attention.json.")] = "all",
) -> None:
    """Time every masked-GEMM algorithm against cuBLAS on Llama-3.1-8B / Qwen3-8B shapes; table, roofline, JSON, PNG.

    Also writes the `auto` thresholds these timings support (per kernel kind, against plain dense) as
    policy-<arch>.json: `wide-export bench kernels --record policy-<arch>.json` makes them the default on
    that GPU.
    """
    import json

    from rich.console import Console

    console = Console(highlight=False)
    if record is not None and device == "cpu":
        from wide_export.bench.cpu_kernels import record_policy as record_cpu
        from wide_export.cpu.ops import POLICY_FILE as CPU_POLICY

        console.print(f"recorded the measured CPU policy of {', '.join(record_cpu(record))} into {CPU_POLICY}")
        return
    if record is not None:
        from wide_export.bench.kernels import record_policy
        from wide_export.kernels.policy import POLICY_FILE

        archs = record_policy(record)
        console.print(f"recorded the measured policy of {archs} into {POLICY_FILE}")
        return

    if device not in ("auto", "cpu", "gpu"):
        from wide_export.base.errors import WideError

        raise WideError(f"unknown --device {device!r}", hint="cpu, gpu or auto")
    if attention not in ("all", "short", "none"):
        from wide_export.base.errors import WideError

        raise WideError(f"unknown --attention {attention!r}", hint="all, short or none")
    if device == "cpu":
        return _bench_cpu(preset, dtype, output, seed)
    dtype = dtype or "bf16"
    if dry_run:
        from wide_export.bench.kernels import plan_kernel_bench

        cases = plan_kernel_bench(preset, dtype)
        console.print(f"dry run: --preset {preset} --dtype {dtype} would time {len(cases)} cases, from "
                      f"{cases[0]} to {cases[-1]}; nothing run", soft_wrap=True)
        if attention != "none":
            from wide_export.bench.attention import CASE_SETS

            console.print(f"dry run: and {2 * len(CASE_SETS[attention])} attention cases (0 % and 50 % skipped)")
        return

    from wide_export.bench.kernels import (measured_policy, roofline_table, run_kernel_bench, speedup_table,
                                           target_checks, write_json, write_plot)

    json_path, png_path = output / "kernels.json", output / "kernels.png"
    with console.status("benchmarking") as status:
        report = run_kernel_bench(preset=preset, dtype=dtype, seed=seed, progress=status.update,
                                  on_row=lambda rep: write_json(rep, json_path))
    write_json(report, json_path)
    plotted = write_plot(report, png_path)
    console.print(speedup_table(report))
    console.print(roofline_table(report))
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
        console.print(f"measured auto policy: {policy_path} (wide-export bench kernels --record {policy_path})")
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else
                                              " (no plot: install matplotlib)"))
    if attention != "none":
        _bench_attention(console, report.arch != "interpreter", attention, dtype, seed, output)


def _bench_attention(console, cuda: bool, which: str, dtype: str, seed: int, output: Path) -> None:
    import json

    from wide_export.bench.attention import CASE_SETS, attention_table, rows_json, run_attention_bench

    with console.status("attention") as status:
        rows = run_attention_bench(cuda, dtype=dtype, seed=seed, cases=CASE_SETS[which] if cuda else None,
                                   progress=status.update)
    console.print(attention_table(rows, "GPU" if cuda else "CPU", interpreter=not cuda))
    path = output / "attention.json"
    path.write_text(json.dumps({"interpreter": not cuda, "rows": rows_json(rows)}, indent=2) + "\n")
    console.print(f"attention results: {path}")


def _bench_cpu(preset: str, dtype: Optional[str], output: Path, seed: int) -> None:
    import json

    from wide_export.bench import cpu_kernels as ck
    from wide_export.base.progress import Steps

    from rich.console import Console

    console = Console(highlight=False, width=max(Console().width, 170))  # the table has 13 columns
    json_path, png_path = output / "cpu-kernels.json", output / "cpu-kernels.png"
    with Steps("bench kernels --device cpu") as steps:
        report = ck.run_cpu_bench(preset=preset, dtypes=(dtype,) if dtype else ("fp32", "bf16"), seed=seed,
                                  progress=steps.update, on_row=lambda rep: ck.write_json(rep, json_path))
    ck.write_json(report, json_path)
    plotted = ck.write_plot(report, png_path)
    console.print(ck.table(report))
    policy_path = output / "cpu-policy.json"
    policy_path.write_text(json.dumps({report.cpu: report.measured_policy}, indent=2) + "\n")
    console.print(f"measured policy for {report.cpu}: {json.dumps(report.measured_policy)} ({policy_path}; "
                  f"wide-export bench kernels --device cpu --record {policy_path} makes it this CPU model's "
                  f"entry in wide_export/cpu/policy.json)", soft_wrap=True)
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else " (no plot: install matplotlib)"))


def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("kernels")(bench_kernels)
