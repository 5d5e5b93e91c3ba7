"""`wide-export onnx` as a library call: load, export, verify, publish.

    run = export_and_verify(Sources(Path("ckpt")), Path("out"), verify=True)
    run.result.wide_nodes, run.report.passed

The export and its verification happen in a hidden folder beside `output`, renamed to `output` at the end
(outdir.atomic_output_dir): an interrupt, also while verifying, leaves no new export and an `output` that
`force` was replacing as it was. A failed verification still publishes (the report says why); the caller
decides what that means (the CLI exits 1)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


@dataclass
class ExportRun:
    result: Any  # export.onnx_export.ExportResult, or the tp manifest (dict) of a sharded export
    report: Optional[Any] = None  # verify.compare.VerifyReport when verified


def export_and_verify(sources, output: Path, *, dtype: str = "float32", opset: int = 20, force: bool = False,
                      verify: bool = True, steps: int = 3, seed: int = 0, sliced: Optional[bool] = None,
                      stages=None, attention_op: bool = False) -> ExportRun:
    """One ONNX graph of `sources` (checkpoint.Sources) in `output`, verified against the PyTorch reference;
    attention_op: routed layers' attention as WideMaskedAttention nodes (export_onnx)."""
    from wide_export.export.onnx_export import export_onnx
    from wide_export.base.outdir import atomic_output_dir
    from wide_export.base.progress import Stages
    from wide_export.export.verify_onnx import REPORT_NAME

    stages = stages or Stages(quiet=True)
    if sources.model_dir is None:
        from wide_export.model.demo import DEMO_NAME

        stages.note(f"no --model given: exporting the embedded demo model, {DEMO_NAME}")
    with stages.stage("load"):
        loaded = sources.load(dtype=dtype, progress=stages.update, lazy=True,  # weights streamed at save
                              checksums=False)  # sha256 computed while tracing (export/provenance.py)
    with atomic_output_dir(output, force) as staging:
        run = ExportRun(export_onnx(loaded, staging, opset=opset, force=True, stages=stages,
                                    attention_op=attention_op))
        if verify:
            from wide_export.pipelines.verify import verify_onnx

            ref = loaded if dtype == "float32" else None
            run.report = verify_onnx(staging, loaded=ref, stages=stages, steps=steps, seed=seed, sliced=sliced,
                                     report_path=staging / REPORT_NAME, load_kwargs=sources.reference_kwargs())
    return run
