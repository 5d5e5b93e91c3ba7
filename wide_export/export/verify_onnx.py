"""`wide-export verify --onnx OUT`: ONNX Runtime vs the PyTorch reference, through Polygraphy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wide_export.base.names import VERIFY_REPORT
from wide_export.export.session import check_graph_files, debug_session, with_masks
from wide_export.verify.common import check_same_model, quiet_polygraphy, reference_for, with_defaults
from wide_export.verify.compare import VerifyReport, compare, run_steps
from wide_export.verify.reference import reference_steps
from wide_export.verify.tolerances import tolerance_for

REPORT_NAME = VERIFY_REPORT  # default report file, inside the verified folder


def needs_slices(onnx_dir: Path, config: dict[str, Any]) -> bool:
    """Whether the whole-graph check would not fit: ONNX Runtime's copy of the weights plus the float32
    reference's, against the memory the kernel says is available (whole when it does not say)."""
    files = [config["files"]["model"], config["files"].get("external_data")]
    stored = sum((Path(onnx_dir) / name).stat().st_size for name in files if name)
    itemsize = 2 if config["dtype"] in ("float16", "bfloat16") else 4
    needed = stored + stored * 4 // itemsize
    available = _available_memory()
    return available is not None and needed > available * 0.6


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def verify_graph(onnx_dir: Path, *, loaded=None, report_path: Path | None = None, stages=None,
                load_kwargs: dict | None = None, sliced: bool | None = None, **settings) -> VerifyReport:
    """Compare ONNX Runtime (CPU) with the reference over a prefill and decode steps.

    A bfloat16 export runs in onnx's reference evaluator instead (verify/evaluator.py: ONNX Runtime's CPU
    provider has no bf16 kernels), the graph as written, with bf16 tensors between the nodes.

    sliced=True runs the graph one layer slice at a time (verify/slices.py) against a reference that
    reads its weights module by module, so neither holds the whole model; None picks it when the whole
    check would not fit in the available memory (needs_slices)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from wide_export.export.onnx_export import read_wide_config
    from wide_export.base.progress import Stages

    stages = stages or Stages(quiet=True)
    settings = with_defaults(settings)
    onnx_dir = Path(onnx_dir)
    config = read_wide_config(onnx_dir, {"engines": "pass it as --engine DIR"})  # its files.* lie inside onnx_dir
    check_graph_files(onnx_dir, config)
    dtype = config["dtype"]
    tol = tolerance_for(dtype)
    if sliced is None:
        sliced = needs_slices(onnx_dir, config)
    quiet_polygraphy()
    with stages.stage("reference"):
        model = reference_for(config, loaded, lazy=sliced, **(load_kwargs or {}))
        check_same_model(model, config)
        steps = reference_steps(model, kv_dtype=dtype, **settings)
    evaluator = dtype == "bfloat16"
    target = "onnx-reference-evaluator" if evaluator else "onnxruntime"
    report = VerifyReport(target, dtype, tol.to_dict(), {**settings, "sliced": sliced})
    if evaluator:
        report.notes.append("bfloat16: run by onnx.reference.ReferenceEvaluator with ml_dtypes bfloat16 tensors "
                            "(the graph as written; ONNX Runtime's CPU provider has no bf16 kernels)")
    with stages.stage("evaluator" if evaluator else "onnxrt"):
        if sliced:
            from wide_export.verify.slices import run_sliced

            run = run_sliced(with_masks(onnx_dir, config), lambda proto: _session(onnx_dir, config, proto),
                             [s.feed for s in steps], [_presents(s.ref) for s in steps],
                             [s.hidden for s in steps], stages.update)
            outs = run.per_layer
            report.notes.append(run.describe())
            report.notes.append(_chained_summary(steps, run.outputs, tol))
            steps = [_with_layer_outputs(s) for s in steps]
        elif evaluator:
            from wide_export.verify.evaluator import EvaluatorRunner, EvaluatorSession

            runner = EvaluatorRunner(EvaluatorSession(with_masks(onnx_dir, config), onnx_dir))
            outs = run_steps(runner, steps, config["num_layers"])
        else:
            runner = OnnxrtRunner(debug_session(onnx_dir, config), name="onnxrt")
            outs = run_steps(runner, steps, config["num_layers"])
    compare(steps, outs, tol, report, "onnxrt")
    if report_path:
        report.write(report_path)
    return report


def _session(onnx_dir: Path, config: dict[str, Any], proto):
    """A session for one slice: ONNX Runtime, or onnx's reference evaluator for a bfloat16 export."""
    if config["dtype"] == "bfloat16":
        from wide_export.verify.evaluator import EvaluatorSession

        return EvaluatorSession(proto, onnx_dir)
    return debug_session(onnx_dir, config, proto.SerializeToString())


def _chained_summary(steps, outs, tol) -> str:
    """One line on the chained run (each slice fed the previous one's output, as in the whole graph)."""
    chained = compare(steps, outs, tol, VerifyReport("onnxruntime", "", {}, {}), "onnxrt")
    logits = next(r for r in chained.outputs if r.name == "logits")
    failing = [r.mask for r in chained.decisions if not r.passed]
    where = f"; first router out of tolerance: {failing[0]}" if failing else ""
    flips = sum(r.flips for r in chained.decisions)
    return (f"per-layer check (the verdict): each layer and the head ran on the reference's residual stream "
            f"and past; chained through all slices as the whole graph runs, logits max |abs| "
            f"{logits.max_abs:.2e} (mean {logits.mean_abs:.2e}), {flips} router flips, "
            f"{'within' if chained.passed else 'OUT OF'} tolerance{where}")


def _with_layer_outputs(step):
    """`step` whose reference also holds each layer's output (`layer_output.{i}`: the residual stream
    entering layer i + 1, or the head), which the per-layer check compares too."""
    from dataclasses import replace

    extra = {f"layer_output.{i}": h for i, h in enumerate(step.hidden[1:])}
    return replace(step, ref={**step.ref, **extra})


def _presents(ref: dict) -> dict:
    return {name: value for name, value in ref.items() if name.startswith("present.")}
