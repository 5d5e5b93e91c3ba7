"""`wide-export onnx --tp N [--balance-text FILE]` as a library call: one graph per rank, optionally with the
FFN groups placed by their measured load on a text, verified against the UNSHARDED reference, published
atomically (pipelines/onnx.py says how)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def export_tp_and_verify(sources, output: Path, *, tp: int, balance_text: Optional[Path] = None,
                         dtype: str = "float32", opset: int = 20, force: bool = False, verify: bool = True,
                         steps: int = 3, seed: int = 0, stages=None):
    """export.pipeline.ExportRun whose result is the tp manifest (dict)."""
    from wide_export.pipelines.onnx import ExportRun
    from wide_export.base.outdir import atomic_output_dir
    from wide_export.base.progress import Stages
    from wide_export.tp.export import export_tp
    from wide_export.tp.plan import TPPlan, check_tp, identity_plan
    from wide_export.export.verify_onnx import REPORT_NAME

    stages = stages or Stages(quiet=True)
    # loaded (lazily: headers and routers only) before anything is said, so a --tp the model does not divide by
    # is the only line
    loaded = sources.load(dtype=dtype, lazy=True, checksums=False)
    check_tp(loaded.config, tp)
    if sources.model_dir is None:
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: exporting the embedded demo model, {DEMO_NAME}")
    plan, balance = identity_plan(loaded.config, tp), None
    if balance_text is not None:
        from wide_export.tp.balance import balance_from_text
        from wide_export.verify.reference import streamed

        with stages.stage("balance"):
            ref = sources.load(dtype="float32", lazy=True, checksums=False)
            bal = balance_from_text(Path(sources.model_dir), Path(balance_text), ref.config, streamed(ref), tp,
                                    progress=stages.update)
        orders = {lay["layer"]: lay["order"] for lay in bal.layers}
        plan = TPPlan(tp, [orders.get(i, o) for i, o in enumerate(plan.ffn_order)], "balanced")
        balance = bal.to_dict()
        for line in bal.lines():
            stages.note(line)
    with atomic_output_dir(output, force) as staging:
        run = ExportRun(export_tp(loaded, staging, plan, opset=opset, force=True, stages=stages, balance=balance))
        if verify:
            from wide_export.pipelines.verify import verify_onnx

            run.report = verify_onnx(staging, stages=stages, steps=steps, seed=seed,
                                     report_path=staging / REPORT_NAME, load_kwargs=sources.reference_kwargs())
    return run
