"""What every verification target shares: the default run, the float32 reference model of an export, and
the checks made before a target runs (export/verify_onnx.py: ONNX Runtime, tp/verify.py: the ranks of a
sharded export, trt/verify.py: TensorRT engines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError
from wide_export.verify.reference import streamed

DEFAULTS = {"batch": 2, "prompt_len": 7, "steps": 3, "seed": 0}  # the run every target compares


def with_defaults(settings: dict[str, Any]) -> dict[str, Any]:
    """The run's settings: DEFAULTS, each overridden where `settings` gives a value (None: the default)."""
    unknown = sorted(set(settings) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown verification settings {unknown}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}


def reference_for(config: dict[str, Any], loaded=None, lazy: bool = False, **load_kwargs):
    """The float32 reference model for an export: the given one, the demo, or the recorded sources.

    lazy=True (sliced verification) reads the checkpoint's weights module by module while the reference
    runs (reference.streamed), instead of loading them all."""
    from wide_export.checkpoint import load_wide_model

    if loaded is not None and loaded.weights is None and str(loaded.model.dtype) == "torch.float32":
        return loaded.model
    if load_kwargs.get("model_dir") is not None or config.get("demo"):
        kwargs = load_kwargs
    else:
        kwargs = _recorded_sources(config)
    ref = load_wide_model(dtype="float32", checksums=False, lazy=lazy, **kwargs)
    return streamed(ref) if ref.weights is not None else ref.model


def _recorded_sources(config: dict[str, Any]) -> dict[str, Any]:
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
    return {"model_dir": model_dir, "router": router, "lora": lora,
            "lora_scale": config.get("lora_scale") or 2.0}


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
