"""`wide-export verify`: compare an exported artifact with the PyTorch reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import (
    LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, SeedOpt, SlicedOpt, user_errors,
)


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)


@user_errors
def verify(
    onnx: Annotated[Optional[Path], typer.Option("--onnx", help="Folder written by `wide-export onnx`.",
                                                 show_default=False)] = None,
    engine: Annotated[Optional[Path], typer.Option(
        "--engine", help="Folder written by `wide-export trt` (needs a CUDA GPU).", show_default=False)] = None,
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    steps: Annotated[int, typer.Option(help="Decode steps after the prefill.")] = 3,
    batch: Annotated[int, typer.Option(help="Prompts per step (row 0 left-padded).")] = 2,
    prompt_len: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 7,
    seed: SeedOpt = 0,
    sliced: SlicedOpt = None,
    report: Annotated[Optional[Path], typer.Option(
        help="Where to write the JSON report (default: verify_report.json in the --onnx or --engine folder).",
        show_default=False)] = None,
) -> None:
    """Check ONNX Runtime against the PyTorch reference: errors per output and router decision agreement.

    Without --model the reference is the checkpoint recorded in wide_config.json
    (or the demo model); --router/--lora go with --model only. Exits 1 when a
    tolerance is exceeded (the report is written either way).
    """
    from wide_export.base.errors import WideError
    from wide_export.base.progress import Stages
    from wide_export.pipelines.verify import verify_onnx

    if (onnx is None) == (engine is None):
        raise WideError("verify one thing", "pass --onnx DIR (from `wide-export onnx`) or --engine DIR "
                        "(from `wide-export trt`)")
    if steps < 0 or batch < 1 or prompt_len < 1:
        raise WideError("--steps must be >= 0, --batch and --prompt-len >= 1", "use positive sizes")
    if model is None and (router is not None or lora is not None):
        raise WideError("--router and --lora need --model", "pass the --model DIR they belong to, or leave all "
                        "three out to verify against the checkpoint recorded in wide_config.json")
    if report is None:  # beside what was verified, not in the current directory
        from wide_export.export.verify_onnx import REPORT_NAME

        report = Path(onnx if onnx is not None else engine) / REPORT_NAME
    load_kwargs = None
    if model is not None:
        load_kwargs = {"model_dir": model, "router": router, "lora": lora, "lora_scale": lora_scale}
    if engine is not None:
        if sliced:
            raise WideError("--sliced verifies an ONNX export", "drop --sliced with --engine (the engine is "
                            "verified whole)")
        from wide_export.trt.verify import verify_engine

        result = verify_engine(engine, report_path=report, load_kwargs=load_kwargs, steps=steps, batch=batch,
                               prompt_len=prompt_len, seed=seed)
        finish_verification(result, report)
        return
    result = verify_onnx(onnx, stages=Stages(), report_path=report, load_kwargs=load_kwargs,
                         steps=steps, batch=batch, prompt_len=prompt_len, seed=seed, sliced=sliced)
    finish_verification(result, report)


def finish_verification(report, path: Path) -> None:
    """Print the tables; exit 1 when the comparison failed."""
    from wide_export.verify.compare import print_report

    print_report(report)
    typer.echo(f"report: {path}", err=True)
    if not report.passed:
        raise typer.Exit(1)
