"""`wide-export bench generate`: CPU generation, WIDE against llama.cpp and our dense path on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import ModelOpt, user_errors


@user_errors
def bench_generate(
    model: ModelOpt = None,
    preset: Annotated[str, typer.Option(help="Without --model: the random-weight checkpoint to write and run "
                                             "('llama-0.4b': 6 layers, hidden 2048, FFN 8192, vocab 4096).")]
    = "llama-0.4b",
    dtype: Annotated[str, typer.Option(help="float32 (llama.cpp on an f32 GGUF), bfloat16 (on a bf16 "
                                            "and an f16 GGUF) or float16 (on an f16 GGUF).")] = "float32",
    sparsity: Annotated[list[float], typer.Option("--sparsity", help="With a preset: WIDE rows with its routers "
                                                                     "set to skip this fraction of groups "
                                                                     "(repeat). Default 0, 0.25, 0.5, 0.75.")]
    = [],  # noqa: B006 - typer needs a literal default
    batch: Annotated[list[int], typer.Option("--batch", help="Sequences decoded together (repeat). Default 1, "
                                                             "4.")] = [],  # noqa: B006
    prompt_len: Annotated[list[int], typer.Option("--prompt-len", help="Prompt tokens (repeat). Default 128, "
                                                                       "1024.")] = [],  # noqa: B006
    new: Annotated[int, typer.Option(help="New tokens per sequence (decode is timed over all but the "
                                          "first).")] = 32,
    threads: Annotated[Optional[int], typer.Option(help="Threads for every runner (default: torch's).")] = None,
    llamacpp: Annotated[bool, typer.Option("--llamacpp/--no-llamacpp", help="Time llama.cpp too (needs "
                                                                           "llama-cpp-python).")] = True,
    output: Annotated[Path, typer.Option(help="Folder for generate.json and generate.png.")]
    = Path("bench-results"),
) -> None:
    """Tokens/s of llama.cpp dense, our dense path and WIDE at each sparsity, on one checkpoint's weights, with
    the weight bytes one decode token reads and the GB/s that makes. CPU only; llama.cpp's rows need
    llama-cpp-python (scripts/test-llamacpp.sh builds .venv-llamacpp), else one line says they are skipped."""
    from rich.console import Console

    from wide_export.bench.generate import run_generate_bench, same_tokens, table, write_outputs

    sparsities = tuple(sparsity) or ((None,) if model is not None else (0.0, 0.25, 0.5, 0.75))
    console = Console(highlight=False)
    with console.status("benchmarking") as status:
        report = run_generate_bench(model, preset=preset, dtype=dtype, sparsities=sparsities,
                                    batches=tuple(batch) or (1, 4), prompt_lens=tuple(prompt_len) or (128, 1024),
                                    new=new, threads=threads, llamacpp=llamacpp, progress=status.update)
    console.print(table(report))
    for note in report.notes:
        console.print(note)
    for label, skipped in report.sparsity.items():
        console.print(f"{label}: groups skipped on random tokens: "
                      + ", ".join(f"{k} {v:.0%}" for k, v in skipped.items()))
    same = same_tokens(report)
    if same is not None:
        console.print(f"our dense greedy tokens vs llama.cpp's (first 8 per case): "
                      f"{'[green]equal[/]' if same else '[yellow]different[/] (near-tied logits of random weights?)'}")
    json_path, png = write_outputs(report, output)
    console.print(f"results: {json_path}" + (f", plot: {png}" if png else " (no plot: install matplotlib)"))


def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("generate")(bench_generate)
