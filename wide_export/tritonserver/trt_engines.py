"""Read an engine folder's manifest (`wide_engine.json`) for the tensorrt flavour.

Schema this module accepts (documented in docs/triton.md; paths are relative to
the engine folder):

    {
      "tensorrt": {"package": "tensorrt_rtx", "version": "1.7.1"},
      "plugins": ["libwide_plugins.so"],
      "model": {<wide_config.json fields>},          # or a wide_config.json beside it
      "engines": [{
        "file": "model.engine",
        "inputs":  [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]}, ...],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, -1, 32000]}, ...],
        "profiles": [{"name": "prefill",
                      "shapes": {"input_ids": {"min": [1, 1], "opt": [1, 64], "max": [8, 512]}, ...}},
                     {"name": "decode", "shapes": {...}}]
      }]
    }

A profile is the prefill one when its name says so or when its past length is
fixed at 0; the decode one otherwise. One profile may serve both phases.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from wide_export.base.errors import WideError
from wide_export.base.names import ENGINE_MANIFEST as MANIFEST
from wide_export.base.names import WIDE_CONFIG
from wide_export.base.paths import confined
from wide_export.tritonserver.export_folder import (
    DEFAULT_IO, ModelShape, check_io_names, check_vocab, count_layers, parse_model_shape, read_model_shape,
)

# Engine/ONNX dtype names -> Triton config data types.
TRITON_TYPES = {
    "float32": "TYPE_FP32", "float": "TYPE_FP32", "fp32": "TYPE_FP32",
    "float16": "TYPE_FP16", "half": "TYPE_FP16", "fp16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16", "bf16": "TYPE_BF16",
    "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One engine I/O tensor: name, Triton data type, dims (-1 = dynamic)."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ProfileSpec:
    """One optimization profile: its index in the engine, phase and shape ranges."""

    index: int
    phase: str  # "prefill", "decode" or "both"
    shapes: dict  # input name -> {"min": [...], "opt": [...], "max": [...]}

    def max_dim(self, name: str, axis: int) -> Optional[int]:
        entry = self.shapes.get(name)
        return int(entry["max"][axis]) if entry else None


@dataclass(frozen=True)
class EngineSpec:
    """One engine file with its I/O and profiles."""

    file: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profiles: tuple[ProfileSpec, ...]


@dataclass(frozen=True)
class EngineSource:
    """An engine folder ready to be turned into tensorrt_plan models."""

    folder: Path
    manifest: Path
    engines: tuple[EngineSpec, ...]
    shape: ModelShape
    plugins: tuple[Path, ...]
    trt_package: str
    trt_version: str
    io: dict


def _tensor(raw: dict, where: str) -> TensorSpec:
    try:
        name, dtype, shape = raw["name"], str(raw["dtype"]).lower(), raw["shape"]
    except (KeyError, TypeError):
        raise WideError(f"{where}: each tensor needs name, dtype and shape, got {raw!r}") from None
    if dtype not in TRITON_TYPES:
        raise WideError(f"{where}: tensor {name} has unsupported dtype {raw['dtype']!r}")
    return TensorSpec(name=name, data_type=TRITON_TYPES[dtype], dims=tuple(int(d) for d in shape))


def _phase(raw: dict, past_name: str) -> str:
    name = str(raw.get("name", raw.get("phase", ""))).lower()
    if name in ("prefill", "decode"):
        return name
    past = raw.get("shapes", {}).get(past_name)
    if past and int(past["max"][2]) == 0:
        return "prefill"
    return "decode" if past and int(past["min"][2]) > 0 else "both"


def _engine(raw: dict, folder: Path, where: str) -> EngineSpec:
    file = folder / str(raw.get("file", ""))
    confined(file, folder, f"{where}: engine file")
    if not file.is_file():
        raise WideError(f"{where}: engine file {file} not found")
    inputs = tuple(_tensor(t, where) for t in raw.get("inputs", []))
    outputs = tuple(_tensor(t, where) for t in raw.get("outputs", []))
    past_name = DEFAULT_IO["past_key"].format(i=0)
    profiles = []
    for index, prof in enumerate(raw.get("profiles") or [{}]):
        shapes = prof.get("shapes", {})
        unknown = set(shapes) - {t.name for t in inputs}
        if unknown:
            raise WideError(f"{where}: profile {index} names unknown inputs {sorted(unknown)}")
        profiles.append(ProfileSpec(index=index, phase=_phase(prof, past_name), shapes=shapes))
    return EngineSpec(file=file, inputs=inputs, outputs=outputs, profiles=tuple(profiles))


def read_engine_folder(folder: Path) -> EngineSource:
    """Parse and validate `wide_engine.json` in `folder`."""
    from wide_export.base.engine_manifest import REBUILD_HINT, read_engine_manifest

    folder = Path(folder)
    manifest = folder / MANIFEST
    raw = read_engine_manifest(folder, "point --engines at the folder written by `wide-export trt`")
    if not isinstance(raw, dict):
        raise WideError(f"{manifest}: expected a JSON object", hint=REBUILD_HINT)
    engines = tuple(_engine(e, folder, str(manifest)) for e in raw.get("engines", []))
    if not engines:
        raise WideError(f"{manifest}: no engines listed")
    if "model" in raw:
        shape = parse_model_shape(raw["model"], manifest)
    else:
        shape = read_model_shape(folder / WIDE_CONFIG)
    for engine in engines:
        names_in = [t.name for t in engine.inputs]
        layers = count_layers(names_in, DEFAULT_IO["past_key"])
        if layers != shape.num_layers:
            raise WideError(f"{manifest}: {engine.file.name} has {layers} KV-cache layers, "
                            f"the model {shape.num_layers}")
        check_io_names(names_in, [t.name for t in engine.outputs], layers, DEFAULT_IO,
                       f"{manifest} ({engine.file.name})")
        logits = next(t for t in engine.outputs if t.name == DEFAULT_IO["logits"])
        check_vocab(shape, list(logits.dims), f"{manifest} ({engine.file.name})")
    plugins = tuple(folder / str(p) for p in raw.get("plugins", []))
    for plugin in plugins:
        confined(plugin, folder, f"{manifest}: plugin library")
        if not plugin.is_file():
            raise WideError(f"{manifest}: plugin library {plugin} not found")
    trt = raw.get("tensorrt", {})
    return EngineSource(
        folder=folder, manifest=manifest, engines=engines, shape=shape, plugins=plugins,
        trt_package=str(trt.get("package", "tensorrt")), trt_version=str(trt.get("version", "unknown")),
        io=dict(DEFAULT_IO),
    )

