"""`wide-export onnx`: load a WIDE checkpoint and export one ONNX graph with `wide` ops."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wide_export.cli.common import (
    AttnGroupOpt, FfnGroupOpt, LoraOpt, LoraScaleOpt, ModelOpt, RouterOpt, SeedOpt, SlicedOpt, user_errors,
)


def register(app: typer.Typer) -> None:
    app.command("onnx")(onnx)


@user_errors
def onnx(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to create (model.onnx, wide_config.json).")],
    model: ModelOpt = None,
    router: RouterOpt = None,
    lora: LoraOpt = None,
    lora_scale: LoraScaleOpt = 2.0,
    attn_group_size: AttnGroupOpt = None,
    ffn_group_size: FfnGroupOpt = None,
    dtype: Annotated[str, typer.Option(help="Weights/activations dtype: float32, float16 or bfloat16 "
                                            "(routers, norm statistics and logits stay float32; a bfloat16 "
                                            "export is verified with onnx's reference evaluator).")] = "float32",
    opset: Annotated[int, typer.Option(help="Default-domain ONNX opset.")] = 20,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check ONNX Runtime against the "
                                         "PyTorch reference afterwards (report: OUTPUT/verify_report.json). A failed "
                                         "check keeps OUTPUT and its report and exits 1.")] = True,
    steps: Annotated[int, typer.Option(help="Decode steps to verify after the prefill.")] = 3,
    seed: SeedOpt = 0,
    sliced: SlicedOpt = None,
    tp: Annotated[Optional[int], typer.Option(
        "--tp", help="Tensor parallelism: one graph per rank (OUTPUT/rank{r}/model.onnx, OUTPUT/tp_manifest.json) "
                     "with DistCollective all-reduces; see docs/distributed.md.", show_default=False)] = None,
    balance_text: Annotated[Optional[Path], typer.Option(
        "--balance-text", help="With --tp: place the FFN groups so the ranks' expected work on this text (UTF-8, "
                               "tokenized with MODEL's tokenizer) is equal.", show_default=False)] = None,
) -> None:
    """Export a WIDE model to ONE ONNX graph (prefill + decode with KV cache).

    Routers and masked projections become `wide` custom ops (docs/opset.md) that
    carry standard-op function bodies, so any ONNX runtime runs the file.

    Exit codes: 0 exported (and verified); 1 exported, but the verification
    failed: OUTPUT and OUTPUT/verify_report.json stay for inspection; 2 bad
    input, nothing written; 130 Ctrl-C or SIGTERM, also while verifying:
    nothing written, an OUTPUT that --force was replacing left as it was.
    """
    from wide_export.errors import WideError
    from wide_export.export.onnx_export import DTYPES
    from wide_export.outdir import check_output_dir
    from wide_export.signals import interrupt_on_signals

    if dtype not in DTYPES:
        raise WideError(f"unsupported --dtype {dtype}", f"choose one of {', '.join(DTYPES)}")
    if balance_text is not None and tp is None:
        raise WideError("--balance-text places FFN groups across tensor-parallel ranks", "add --tp N")
    if balance_text is not None and model is None:
        raise WideError("--balance-text needs the model's tokenizer", "pass --model DIR (with tokenizer.json)")
    if tp is not None:  # what config.json decides, before anything heavy is imported or read (check_tp: the rest)
        from wide_export.tp.plan import check_tp_early

        check_tp_early(model, tp)
    if tp is not None and dtype == "bfloat16" and verify:
        raise WideError("a bfloat16 --tp export cannot be verified on CPU", "add --no-verify, or export float32")
    check_output_dir(output, force, protect=(model, router, lora))  # fail before minutes of loading
    if tp is not None:
        with interrupt_on_signals():
            from wide_export.cli.onnx_tp_cmd import export_tp_cmd

            export_tp_cmd(output, model, router, lora, lora_scale, attn_group_size, ffn_group_size, dtype, opset,
                          force, verify, steps, seed, tp, balance_text)
        return
    with interrupt_on_signals():  # SIGTERM cleans up as Ctrl-C does (no hidden temp folder stays)
        _export(output, model, router, lora, lora_scale, attn_group_size, ffn_group_size, dtype, opset, force,
                verify, steps, seed, sliced)


def _export(output, model, router, lora, lora_scale, attn_group_size, ffn_group_size, dtype, opset, force,
            verify, steps, seed, sliced) -> None:
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx
    from wide_export.progress import Stages

    stages = Stages()
    if model is None:
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: exporting the embedded demo model, {DEMO_NAME}")
    with stages.stage("load"):
        loaded = load_wide_model(model, router=router, lora=lora, lora_scale=lora_scale,
                                 attn_group_size=attn_group_size, ffn_group_size=ffn_group_size,
                                 dtype=dtype, progress=stages.update, lazy=True,  # weights streamed at save
                                 checksums=False)  # sha256 computed while tracing (export/provenance.py)
    from wide_export.outdir import atomic_output_dir
    from wide_export.verify.onnx_verify import REPORT_NAME

    report = None
    # Export and verify in a hidden folder beside OUTPUT, renamed to OUTPUT at the end: Ctrl-C or SIGTERM,
    # also while verifying, leaves no new export and an OUTPUT replaced with --force as it was.
    with atomic_output_dir(output, force) as staging:
        result = export_onnx(loaded, staging, opset=opset, force=True, stages=stages)
        if verify:
            from wide_export.verify.onnx_verify import verify_onnx

            ref = loaded if dtype == "float32" else None
            report = verify_onnx(staging, loaded=ref, stages=stages, steps=steps, seed=seed, sliced=sliced,
                                 report_path=staging / REPORT_NAME,
                                 load_kwargs=_reload_kwargs(model, router, lora, lora_scale))
    counts = ", ".join(f"{n} {op}" for op, n in result.wide_nodes.items())
    stages.note(f"wrote {output}/model.onnx ({counts})")
    if report is not None:
        from wide_export.cli.verify_cmd import finish_verification

        finish_verification(report, output / REPORT_NAME)  # a failed check keeps OUTPUT, exits 1


def _reload_kwargs(model, router, lora, lora_scale) -> dict:
    return {"model_dir": model, "router": router, "lora": lora, "lora_scale": lora_scale}
