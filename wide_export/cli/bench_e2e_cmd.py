"""`wide-export bench e2e`: WIDE layer stack vs the same stack dense (GPU; the tiny preset on CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import user_errors


@user_errors
def bench_e2e(
    preset: Annotated[Optional[str], typer.Option(help="'llama-3.1-8b' (GPU: Llama-3.1-8B layers, prefill 512/2k/8k, "
                                                       "decode batch 1/4 with CUDA graphs) or 'tiny' (CPU "
                                                       "interpreter smoke run; timings mean nothing). Default: "
                                                       "llama-3.1-8b on a GPU, tiny on CPU.",
                                                  show_default=False)] = None,
    sparsity: Annotated[list[float], typer.Option("--sparsity", help="Target sparsity of every router "
                                                                     "(repeat the option for several).")]
    = [0.25, 0.5, 0.75],  # noqa: B006 - typer needs a literal default
    layers: Annotated[Optional[int], typer.Option(help="Layers in the timed stack (the preset's by default); "
                                                       "tokens/s scale to the model's layer count.",
                                                  show_default=False)] = None,
    dtype: Annotated[Optional[str], typer.Option(help="fp16 or bf16 (GPU; default fp16); fp32, bf16 or fp16 "
                                                      "(--device cpu; default fp32).", show_default=False)] = None,
    device: Annotated[str, typer.Option(help="cpu: Llama-3.1-8B layers on this CPU, the WIDE side through the "
                                             "compiled CPU kernels (wide_export.cpu), real timings; auto: the GPU "
                                             "(or the tiny preset in the Triton interpreter).")] = "auto",
    algo: Annotated[str, typer.Option(help="Kernel algorithm of the WIDE side (auto follows policy.json).")]
    = "auto",
    llamacpp: Annotated[bool, typer.Option("--llamacpp/--no-llamacpp",
                                           help="--device cpu: also time llama.cpp dense on layers of the same "
                                                "shapes (needs llama-cpp-python: scripts/test-llamacpp.sh).")]
    = True,
    output: Annotated[Path, typer.Option(help="Folder for e2e.json and e2e.png.")] = Path("bench-results"),
    seed: Annotated[int, typer.Option(help="Seed of the weights, routers and inputs.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the options, import the kernels and list "
                                                            "the cases, then stop before the first CUDA call "
                                                            "(scripts/gpu-check.sh's CI dry run).")] = False,
) -> None:
    """Prefill and decode tokens/s of a WIDE model vs the same model dense; table, JSON, PNG.

    Random weights; routers biased to each --sparsity; SDPA attention on both sides,
    wide_export.kernels on the WIDE side, cuBLAS on the dense side. The paper's
    end-to-end figures (1.68x prefill, 1.55x decode at 50 %) are printed alongside.
    """
    from rich.console import Console

    from wide_export.bench.e2e import run_e2e_bench, table, write_json, write_plot

    console = Console(highlight=False, width=max(Console().width, 110))  # the table needs ~100 columns
    if dry_run:
        from wide_export.bench.e2e import plan_e2e_bench

        name = preset or ("llama-3.1-8b-cpu" if device == "cpu" else "llama-3.1-8b")
        cases = plan_e2e_bench(name, tuple(sparsity), dtype or ("fp32" if device == "cpu" else "fp16"), layers,
                               algo, device)
        console.print(f"dry run: --preset {name} would time {len(cases)} cases, from {cases[0]} to {cases[-1]}; "
                      f"nothing run", soft_wrap=True)
        return

    with console.status("benchmarking") as status:
        report = run_e2e_bench(preset=preset, sparsities=tuple(sparsity),
                               dtype=dtype or ("fp32" if device == "cpu" else "fp16"), layers=layers, algo=algo,
                               seed=seed, progress=status.update, device=device, llamacpp=llamacpp)
    console.width = max(console.width, 110 + 45 * len(report.llamacpp))  # llama.cpp's two columns per GGUF type
    json_path, png_path = output / "e2e.json", output / "e2e.png"
    write_json(report, json_path)
    plotted = write_plot(report, png_path)
    if not report.timings_meaningful:
        console.print("[yellow]CPU run through the Triton interpreter: the timings mean nothing[/]")
    console.print(table(report))
    for s, c in report.check.items():
        r = report.realized[s]
        ok = c["mask_agreement"] >= 0.99 and c["max_rel_error"] <= 2e-2
        console.print(f"{float(s):.0%}: realized sparsity attention {r['attention']:.1%}, ffn {r['ffn']:.1%}; "
                      f"layer 0 vs PyTorch reference {'[green]ok[/]' if ok else '[red]MISMATCH[/]'} (mask "
                      f"agreement {c['mask_agreement']:.2%}, max rel. error {c['max_rel_error']:.1e})")
    for note in report.notes:
        console.print(f"[yellow]{note}[/]")
    for c in report.cases:
        if c.note:
            console.print(f"[yellow]note[/] {c.phase} {c.tokens}: {c.note}")
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else
                                              " (no plot: install matplotlib)"))


def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("e2e")(bench_e2e)
