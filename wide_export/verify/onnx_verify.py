"""`wide-export verify --onnx OUT`: ONNX Runtime vs the PyTorch reference, through Polygraphy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wide_export.errors import WideError
from wide_export.verify.compare import VerifyReport, compare, run_steps
from wide_export.verify.reference import reference_steps
from wide_export.verify.tolerances import tolerance_for

DEFAULTS = {"batch": 2, "prompt_len": 7, "steps": 3, "seed": 0}
REPORT_NAME = "verify_report.json"  # default report file, inside the verified folder


def reference_for(config: dict[str, Any], loaded=None, **load_kwargs):
    """The float32 reference model for an export: the given one, the demo, or the recorded sources."""
    from wide_export.checkpoint import load_wide_model

    if loaded is not None and loaded.weights is None and str(loaded.model.dtype) == "torch.float32":
        return loaded.model
    if load_kwargs.get("model_dir") is not None or config.get("demo"):
        return load_wide_model(dtype="float32", checksums=False, **load_kwargs).model
    src = config.get("sources", {})
    try:
        model_dir = Path(src["config"]["path"]).parent
        router = Path(src["router"]["path"])
        lora = Path(src["lora"]["path"]) if "lora" in src else None
    except KeyError:
        raise WideError("wide_config.json does not say which checkpoint was exported",
                        "pass --model (and --router/--lora) to verify against") from None
    if not model_dir.is_dir() or not router.is_file():
        raise WideError(f"the exported checkpoint is no longer at {model_dir}",
                        "pass --model (and --router/--lora) to verify against")
    return load_wide_model(model_dir, router=router, lora=lora, lora_scale=config.get("lora_scale") or 2.0,
                           checksums=False).model


def debug_model_with_masks(onnx_dir: Path, config: dict[str, Any]) -> bytes:
    """model.onnx (without its weights) with the router masks as extra graph outputs, serialized."""
    import onnx

    proto = onnx.load(str(onnx_dir / config["files"]["model"]), load_external_data=False)
    known = {o.name for o in proto.graph.output}
    for layer in config["layers"]:
        for kind in ("attention", "ffn"):
            if layer[kind] and layer[kind]["mask"] not in known:
                proto.graph.output.append(onnx.helper.make_tensor_value_info(layer[kind]["mask"],
                                                                             onnx.TensorProto.INT32, None))
    return proto.SerializeToString()


def debug_session(onnx_dir: Path, config: dict[str, Any]):
    """An ONNX Runtime CPU session of debug_model_with_masks. External weights are read from the export
    folder itself (a copy or link of them elsewhere is refused by ONNX Runtime as a path escape)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(Path(onnx_dir).resolve()))
    return ort.InferenceSession(debug_model_with_masks(onnx_dir, config), options,
                                providers=["CPUExecutionProvider"])


def verify_onnx(onnx_dir: Path, *, loaded=None, report_path: Path | None = None, stages=None,
                load_kwargs: dict | None = None, **settings) -> VerifyReport:
    """Compare ONNX Runtime (CPU) with the reference over a prefill and decode steps."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from wide_export.export.onnx_export import read_wide_config
    from wide_export.progress import Stages

    stages = stages or Stages(quiet=True)
    settings = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    onnx_dir = Path(onnx_dir)
    config = read_wide_config(onnx_dir)
    dtype = config["dtype"]
    tol = tolerance_for(dtype)
    quiet_polygraphy()
    with stages.stage("reference"):
        model = reference_for(config, loaded, **(load_kwargs or {}))
        check_same_model(model, config)
        steps = reference_steps(model, kv_dtype=dtype, **settings)
    with stages.stage("onnxrt"):
        runner = OnnxrtRunner(debug_session(onnx_dir, config), name="onnxrt")
        outs = run_steps(runner, steps, config["num_layers"])
    report = VerifyReport("onnxruntime", dtype, tol.to_dict(), settings)
    compare(steps, outs, tol, report, "onnxrt")
    if report_path:
        report.write(report_path)
    return report


def check_same_model(model, config: dict[str, Any]) -> None:
    c = model.config
    for key in ("num_layers", "hidden_size", "vocab_size", "num_key_value_heads", "head_dim"):
        ref = getattr(c, key)
        if config.get(key) != ref:
            raise WideError(f"the reference model has {key}={ref} but the export has {config.get(key)}",
                            "pass the --model/--router the ONNX folder was exported from")


def quiet_polygraphy() -> None:
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
