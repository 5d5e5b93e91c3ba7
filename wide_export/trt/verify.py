"""`wide-export verify --engine DIR`: the engine through Polygraphy's TrtRunner vs the PyTorch reference.

The comparison itself (errors per output with Polygraphy's comparator, router
decision agreement, report tables) is the ONNX verification's
(wide_export/verify/compare.py); this module only supplies the engine side:
load the plugin library, deserialize the engine, run the prefill step on
profile 0 and the decode steps on profile 1. Router decisions are compared
when the engine was built with `--mask-outputs` (else the report says so).
Needs a CUDA GPU: TensorRT engines do not run on a CPU.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

from wide_export.base.errors import WideError
from wide_export.base.names import ENGINE_MANIFEST as MANIFEST
from wide_export.trt.backend import has_gpu, needs_child, rtx_child_env, select_backend
from wide_export.verify.common import check_same_model, quiet_polygraphy, reference_for, with_defaults


def read_manifest(engine_dir: Path) -> dict[str, Any]:
    """OUT/wide_engine.json, with clear errors for a folder that is not an engine build (base/engine_manifest.py)."""
    from wide_export.base.engine_manifest import REBUILD_HINT, read_engine_manifest

    manifest = read_engine_manifest(engine_dir, "build the engine first: wide-export trt --onnx DIR --output DIR")
    if not isinstance(manifest, dict) or not manifest.get("engines"):
        raise WideError(f"{Path(engine_dir) / MANIFEST} lists no engines", REBUILD_HINT)
    return manifest


class PhaseRunner:
    """A Polygraphy-style runner that sends prefill feeds (past length 0) to
    profile 0 and decode feeds to profile 1 of one engine."""

    def __init__(self, engine, past_name: str = "past_key_values.0.key"):
        from polygraphy.backend.trt import TrtRunner

        self.past_name = past_name
        self.prefill = TrtRunner(engine, name="trt-prefill", optimization_profile=0)
        self.decode = TrtRunner(engine, name="trt-decode", optimization_profile=1)

    def __enter__(self) -> "PhaseRunner":
        self.prefill.activate()
        self.decode.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.decode.deactivate()
        self.prefill.deactivate()

    def infer(self, feed: dict) -> dict:
        runner = self.prefill if feed[self.past_name].shape[2] == 0 else self.decode
        return runner.infer(feed)


def _check_settings(manifest: dict[str, Any], batch: int, prompt_len: int, steps: int) -> None:
    lim = manifest.get("limits", {})
    if batch > lim.get("max_batch", batch) or prompt_len > lim.get("max_input_len", prompt_len) \
            or prompt_len + steps > lim.get("max_seq_len", prompt_len + steps):
        raise WideError(f"batch {batch}, prompt {prompt_len} + {steps} steps exceed the engine's limits {lim}",
                        hint="use smaller --batch/--prompt-len/--steps or rebuild with larger limits")


def verify_engine_here(engine_dir: str, report_path: Optional[str] = None, load_kwargs: Optional[dict] = None,
                       **settings: Any) -> dict[str, Any]:
    """verify_engine's work in this process; returns the report as a dict."""
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes

    from wide_export.trt.plugins import load_plugin_library
    from wide_export.trt.recipes import tolerance_with
    from wide_export.verify.compare import VerifyReport, compare, run_steps
    from wide_export.verify.reference import reference_steps

    folder = Path(engine_dir)
    manifest = read_manifest(folder)
    settings = with_defaults(settings)
    _check_settings(manifest, settings["batch"], settings["prompt_len"], settings["steps"])
    if not has_gpu():
        raise WideError("running a TensorRT engine needs a CUDA GPU and there is none on this machine",
                        hint="run `wide-export verify --engine` where the engine will be deployed")
    config = manifest.get("model")
    if not config:
        raise WideError(f"{folder / MANIFEST} carries no model config",
                        hint="rebuild with `wide-export trt` from a `wide-export onnx` folder")
    dtype = manifest.get("precision", "float32")
    tol = tolerance_with(dtype, ((manifest.get("recipe") or {}).get("tolerances") or {}).get(dtype, {}))
    backend = select_backend(manifest["tensorrt"]["package"])
    for lib in manifest.get("plugins", []):
        load_plugin_library(backend, folder / lib)
    quiet_polygraphy()
    paths = {k: (Path(v) if k in ("model_dir", "router", "lora") and v else v) for k, v in (load_kwargs or {}).items()}
    model = reference_for(config, None, **paths)
    check_same_model(model, config)
    steps = reference_steps(model, kv_dtype=dtype, **settings)
    engine = EngineFromBytes(BytesFromPath(str(folder / manifest["engines"][0]["file"])))()
    outs = run_steps(PhaseRunner(engine), steps, config["num_layers"])
    report = VerifyReport(f"{backend.flavour} {backend.version} engine", dtype, tol.to_dict(), settings)
    compare(steps, outs, tol, report, "trt")
    nodes = manifest.get("wide_nodes", {})
    report.notes.append(f"{nodes.get('plugin_layers', 0)} of {nodes.get('total', 0)} wide nodes are plugin layers")
    if report_path:
        report.write(Path(report_path))
    return report.to_dict()


def report_from_dict(data: dict[str, Any]):
    """Rebuild a VerifyReport from its to_dict() form (reports cross the child-process boundary as JSON)."""
    from wide_export.verify.compare import DecisionRow, OutputRow, VerifyReport

    names = {f.name for f in fields(VerifyReport)}
    report = VerifyReport(**{k: v for k, v in data.items() if k in names and k not in ("outputs", "decisions")})
    report.outputs = [OutputRow(**r) for r in data.get("outputs", [])]
    report.decisions = [DecisionRow(**r) for r in data.get("decisions", [])]
    return report


def verify_engine(engine_dir: Path, *, report_path: Optional[Path] = None, load_kwargs: Optional[dict] = None,
                  **settings: Any):
    """Compare the engine in `engine_dir` with the PyTorch reference; returns a VerifyReport.

    settings: batch, prompt_len, steps, seed (as `wide-export verify`). With
    TensorRT-RTX the work runs in a child process (backend.py explains why).
    """
    manifest = read_manifest(Path(engine_dir))
    args = {"engine_dir": str(engine_dir), "report_path": str(report_path) if report_path else None,
            "load_kwargs": {k: (str(v) if isinstance(v, Path) else v) for k, v in (load_kwargs or {}).items()}
            or None, **settings}
    package = manifest.get("tensorrt", {}).get("package")
    if needs_child(package):
        from wide_export.trt._child import run_in_child

        env = {**rtx_child_env(), "POLYGRAPHY_USE_TENSORRT_RTX": "1"}
        return report_from_dict(run_in_child("wide_export.trt.verify:verify_engine_here", args, env))
    return report_from_dict(verify_engine_here(**args))
