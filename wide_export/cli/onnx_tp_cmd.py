"""`wide-export onnx --tp N [--balance-text FILE]`: the command body (parsed and checked by cli/onnx_cmd.py)."""

from __future__ import annotations

from pathlib import Path


def export_tp_cmd(output: Path, model, router, lora, lora_scale, attn_group_size, ffn_group_size, dtype, opset,
                  force, verify, steps, seed, tp: int, balance_text) -> None:
    from wide_export.checkpoint import load_wide_model
    from wide_export.outdir import atomic_output_dir
    from wide_export.progress import Stages
    from wide_export.tp.export import export_tp
    from wide_export.tp.plan import TPPlan, check_tp, identity_plan
    from wide_export.verify.onnx_verify import REPORT_NAME

    stages = Stages()
    # loaded (lazily: headers and routers only) before anything is printed, so a --tp the model does not
    # divide by is one line
    loaded = load_wide_model(model, router=router, lora=lora, lora_scale=lora_scale,
                             attn_group_size=attn_group_size, ffn_group_size=ffn_group_size, dtype=dtype,
                             lazy=True, checksums=False)
    check_tp(loaded.config, tp)
    if model is None:
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: exporting the embedded demo model, {DEMO_NAME}")
    plan, balance = identity_plan(loaded.config, tp), None
    if balance_text is not None:
        from wide_export.tp.balance import balance_from_text
        from wide_export.verify.reference import streamed

        with stages.stage("balance"):
            ref = load_wide_model(model, router=router, lora=lora, lora_scale=lora_scale, dtype="float32",
                                  lazy=True, checksums=False)
            bal = balance_from_text(Path(model), Path(balance_text), ref.config, streamed(ref), tp,
                                    progress=stages.update)
        orders = {lay["layer"]: lay["order"] for lay in bal.layers}
        plan = TPPlan(tp, [orders.get(i, o) for i, o in enumerate(plan.ffn_order)], "balanced")
        balance = bal.to_dict()
        for line in bal.lines():
            stages.note(line)
    report = None
    with atomic_output_dir(output, force) as staging:
        manifest = export_tp(loaded, staging, plan, opset=opset, force=True, stages=stages, balance=balance)
        if verify:
            from wide_export.verify.onnx_verify import verify_onnx

            report = verify_onnx(staging, stages=stages, steps=steps, seed=seed, report_path=staging / REPORT_NAME,
                                 load_kwargs={"model_dir": model, "router": router, "lora": lora,
                                              "lora_scale": lora_scale})
    stages.note(f"wrote {output}: {tp} rank graph(s) (rank*/model.onnx, "
                f"{manifest['ranks'][0]['collectives']} DistCollective all-reduces each) and tp_manifest.json")
    if report is not None:
        from wide_export.cli.verify_cmd import finish_verification

        finish_verification(report, output / REPORT_NAME)
