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
    attention_op: Annotated[bool, typer.Option(
        "--attention-op", help="Trace each routed layer's attention as one `wide` WideMaskedAttention node (its "
                               "function body is the same attention in standard ops; TensorRT builds it from "
                               "that body until its plugin exists). Not with --tp.")] = False,
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
    from wide_export.base.errors import WideError
    from wide_export.export.onnx_export import DTYPES
    from wide_export.base.outdir import check_output_dir
    from wide_export.base.signals import interrupt_on_signals

    if dtype not in DTYPES:
        raise WideError(f"unsupported --dtype {dtype}", f"choose one of {', '.join(DTYPES)}")
    if attention_op and tp is not None:
        raise WideError("--attention-op is for one graph; a --tp export traces its ranks' attention inline",
                        "drop --attention-op or --tp")
    if balance_text is not None and tp is None:
        raise WideError("--balance-text places FFN groups across tensor-parallel ranks", "add --tp N")
    if balance_text is not None and model is None:
        raise WideError("--balance-text needs the model's tokenizer", "pass --model DIR (with tokenizer.json)")
    if tp is not None:  # what config.json decides, before anything heavy is imported or read (check_tp: the rest)
        from wide_export.tp.plan import check_tp_early

        check_tp_early(model, tp)
    if tp is not None and dtype == "bfloat16" and verify:
        raise WideError("a bfloat16 --tp export cannot be verified on CPU", "add --no-verify, or export float32")
    from wide_export.checkpoint import Sources
    from wide_export.base.progress import Stages

    sources = Sources(model, router, lora, lora_scale, attn_group_size, ffn_group_size)
    check_output_dir(output, force, protect=sources.given_paths())  # fail before minutes of loading
    stages = Stages()
    with interrupt_on_signals():  # SIGTERM cleans up as Ctrl-C does (no hidden temp folder stays)
        if tp is not None:
            from wide_export.pipelines.tp import export_tp_and_verify

            run = export_tp_and_verify(sources, output, tp=tp, balance_text=balance_text, dtype=dtype, opset=opset,
                                       force=force, verify=verify, steps=steps, seed=seed, stages=stages)
            manifest = run.result
            stages.note(f"wrote {output}: {tp} rank graph(s) (rank*/model.onnx, "
                        f"{manifest['ranks'][0]['collectives']} DistCollective all-reduces each) and tp_manifest.json")
        else:
            from wide_export.pipelines.onnx import export_and_verify

            run = export_and_verify(sources, output, dtype=dtype, opset=opset, force=force, verify=verify,
                                    steps=steps, seed=seed, sliced=sliced, stages=stages, attention_op=attention_op)
            counts = ", ".join(f"{n} {op}" for op, n in run.result.wide_nodes.items())
            stages.note(f"wrote {output}/model.onnx ({counts})")
    if run.report is not None:
        from wide_export.cli.verify_cmd import finish_verification
        from wide_export.export.verify_onnx import REPORT_NAME

        finish_verification(run.report, output / REPORT_NAME)  # a failed check keeps OUTPUT, exits 1
