"""Read what a repository is generated from: an ONNX model folder's wide_config.json
and graph I/O, so nothing about the model is typed by hand.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from wide_export.errors import WideError
from wide_export.names import ONNX_FILE, WIDE_CONFIG

# The graph contract (Hugging Face / onnxruntime-genai names); {i} is the layer index.
DEFAULT_IO = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "position_ids": "position_ids",
    "past_key": "past_key_values.{i}.key",
    "past_value": "past_key_values.{i}.value",
    "logits": "logits",
    "present_key": "present.{i}.key",
    "present_value": "present.{i}.value",
}
KV_DTYPES = {"float32", "float16"}
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16"}


@dataclass(frozen=True)
class ModelShape:
    """The numbers the generation model needs about the LLM."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str
    max_position_embeddings: int


def _int_field(cfg: dict, names: tuple[str, ...], where: Path) -> int:
    for name in names:
        if name in cfg:
            value = cfg[name]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise WideError(f"{where}: {name} must be a positive integer, got {value!r}")
            return value
    raise WideError(f"{where}: missing field {names[0]!r}",
                    hint="re-export the model with `wide-export onnx`")


def kv_dtype_name(raw: object, where: Path) -> str:
    """Normalise a KV-cache dtype name to float32 / float16."""
    name = _DTYPE_ALIASES.get(str(raw).lower(), str(raw).lower())
    if name in ("bfloat16", "bf16"):  # the generation model keeps the KV cache in numpy, which has no bf16
        raise WideError(f"{where}: a bfloat16 model cannot be served by the Triton generation model yet "
                        "(its KV cache is float32 or float16)",
                        hint="to serve it, export with --dtype float16 (or float32) and build with "
                        "`wide-export trt --fp16`")
    if name not in KV_DTYPES:
        raise WideError(f"{where}: dtype {raw!r} is not supported for serving (float32 or float16)",
                        hint="export with --dtype float16 or float32")
    return name


def read_model_shape(config_path: Path) -> ModelShape:
    """Parse wide_config.json (the fields written by `wide-export onnx`)."""
    try:
        cfg = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise WideError(f"{config_path} not found",
                        hint="point at the folder written by `wide-export onnx --output DIR`") from None
    except json.JSONDecodeError as err:
        raise WideError(f"{config_path} is not valid JSON: {err}") from None
    return parse_model_shape(cfg, config_path)


def parse_model_shape(cfg: object, config_path: Path) -> ModelShape:
    """Validate wide_config.json fields (already parsed); `config_path` names them in errors."""
    if not isinstance(cfg, dict):
        raise WideError(f"{config_path}: expected a JSON object")
    return ModelShape(
        num_layers=_int_field(cfg, ("num_layers", "num_hidden_layers"), config_path),
        num_kv_heads=_int_field(cfg, ("num_key_value_heads",), config_path),
        head_dim=_int_field(cfg, ("head_dim",), config_path),
        vocab_size=_int_field(cfg, ("vocab_size",), config_path),
        kv_dtype=kv_dtype_name(cfg.get("dtype", "float32"), config_path),
        max_position_embeddings=_int_field(cfg, ("max_position_embeddings",), config_path),
    )


def check_io_names(inputs: list[str], outputs: list[str], num_layers: int, io: dict, where: str) -> None:
    """The graph/engine must have exactly the contract's I/O for `num_layers` layers."""
    want_in = {io["input_ids"], io["attention_mask"], io["position_ids"]}
    want_out = {io["logits"]}
    for i in range(num_layers):
        want_in |= {io["past_key"].format(i=i), io["past_value"].format(i=i)}
        want_out |= {io["present_key"].format(i=i), io["present_value"].format(i=i)}
    for kind, have, want in (("inputs", set(inputs), want_in), ("outputs", set(outputs), want_out)):
        if have != want:
            missing, extra = sorted(want - have), sorted(have - want)
            raise WideError(f"{where}: {kind} do not match the KV-cache contract for {num_layers} layers "
                            f"(missing {missing[:4]}, unexpected {extra[:4]})",
                            hint="export with `wide-export onnx` (one graph with past_key_values inputs)")


def count_layers(names: list[str], pattern: str) -> int:
    """How many layers `pattern` ('past_key_values.{i}.key') covers in `names`."""
    regex = re.compile("^" + re.escape(pattern).replace(r"\{i\}", r"(\d+)") + "$")
    return len({m.group(1) for n in names if (m := regex.match(n))})


@dataclass(frozen=True)
class OnnxSource:
    """An ONNX model folder ready to serve."""

    folder: Path
    onnx_file: Path
    data_files: tuple[Path, ...]
    shape: ModelShape
    io: dict


def read_onnx_folder(folder: Path) -> OnnxSource:
    """Validate the folder from `wide-export onnx --output DIR` against the graph contract."""
    import onnx

    folder = Path(folder)
    onnx_file = folder / ONNX_FILE
    if not onnx_file.is_file():
        raise WideError(f"{onnx_file} not found", hint="point --onnx at the folder written by `wide-export onnx`")
    shape = read_model_shape(folder / WIDE_CONFIG)
    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError and friends
        raise WideError(f"{onnx_file} is not a readable ONNX model: {err}") from None
    inputs = [v.name for v in model.graph.input]
    outputs = [v.name for v in model.graph.output]
    check_io_names(inputs, outputs, shape.num_layers, DEFAULT_IO, str(onnx_file))
    _check_config_io(json.loads((folder / WIDE_CONFIG).read_text()), inputs, outputs, folder / WIDE_CONFIG)
    data = sorted({
        entry.value
        for tensor in _all_initializers(model)
        for entry in tensor.external_data
        if entry.key == "location"
    })
    data_files = tuple(folder / name for name in data)
    for path in data_files:
        if not path.is_file():
            raise WideError(f"{onnx_file} refers to external data {path.name}, which is missing")
    return OnnxSource(folder=folder, onnx_file=onnx_file, data_files=data_files, shape=shape, io=dict(DEFAULT_IO))


def _check_config_io(cfg: dict, inputs: list[str], outputs: list[str], where: Path) -> None:
    """When wide_config.json lists the graph I/O ("io": {"inputs": [{name, ...}], ...}), it must agree."""
    io = cfg.get("io")
    if not isinstance(io, dict):
        return
    for kind, have in (("inputs", inputs), ("outputs", outputs)):
        listed = [entry.get("name") for entry in io.get(kind, []) if isinstance(entry, dict)]
        if listed and sorted(listed) != sorted(have):
            raise WideError(f"{where}: io.{kind} does not match the graph's {kind}",
                            hint="the folder mixes files from different exports; re-export")


def _all_initializers(model):
    import onnx

    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
