"""`wide-export analyze`: realized sparsity, perplexity dense vs WIDE and predicted speed-up on a text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import LoraOpt, LoraScaleOpt, RouterOpt, model_folder_callback, user_errors


@user_errors
def analyze(
    model: Annotated[Path, typer.Option("--model", help="Hugging Face model folder with router.pth and its "
                                                        "tokenizer (tokenizer.json).", show_default=False,
                                        callback=model_folder_callback)],
    text: Annotated[Path, typer.Option("--text", help="UTF-8 text file to run the model over.", show_default=False)],
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    window: Annotated[int, typer.Option("--window", help="Tokens per window (non-overlapping; each window is "
                                                         "one prefill from an empty cache).")] = 512,
    kernels_json: Annotated[Optional[Path], typer.Option(
        "--kernels-json", help="kernels.json of `wide-export bench kernels`: adds the predicted speed-up per "
                               "layer and in total.", show_default=False)] = None,
    onnx: Annotated[Optional[Path], typer.Option(
        "--onnx", help="A `wide-export onnx` folder of this model: adds the export's perplexity and router "
                       "agreement on the same windows (onnxruntime, CPU).", show_default=False)] = None,
    output: Annotated[Path, typer.Option("--output", help="Folder for analyze.json and analyze.png.")]
    = Path("analyze-results"),
    tp: Annotated[Optional[int], typer.Option(
        "--tp", help="Also predict each tensor-parallel rank's FFN load on this text, identity vs balanced "
                     "placement (what `wide-export onnx --tp N --balance-text` does).", show_default=False)] = None,
) -> None:
    """Run the PyTorch reference over a text: per-layer realized sparsity, perplexity dense vs WIDE; table + plot."""
    from rich.console import Console

    from wide_export.analyze.report import summary_lines, table, write_json, write_plot
    from wide_export.analyze.run import analyze_text

    from wide_export.base.progress import Steps

    console = Console(highlight=False, width=max(Console().width, 110))  # the table needs ~100 columns
    # Progress on stderr: the window and layer on a terminal, one line per window when piped.
    with Steps("analyze", console=Console(stderr=True, highlight=False)) as steps:
        report = analyze_text(model, text, router=router, lora=lora, lora_scale=lora_scale, window=window,
                              kernels_json=kernels_json, onnx_dir=onnx, progress=steps.say, tp=tp)
    console.print(table(report))
    for line in summary_lines(report):
        console.print(line)
    if report.tp:
        from wide_export.tp.balance import print_tp

        print_tp(console, report.tp)
    json_path, png_path = output / "analyze.json", output / "analyze.png"
    write_json(report, json_path)
    plotted = write_plot(report, png_path)
    console.print(f"results: {json_path}" + (f", plot: {png_path}" if plotted else
                                              " (no plot: install matplotlib)"))


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
