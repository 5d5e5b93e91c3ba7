"""Read what a repository is generated from: an ONNX model folder's wide_config.json
and graph I/O, so nothing about the model is typed by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from wide_export.base.errors import WideError
from wide_export.base.names import ONNX_FILE, WIDE_CONFIG
from wide_export.base.paths import confined, external_data_files, load_graph, read_json

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
    return parse_model_shape(_read_config(config_path), config_path)


def _read_config(config_path: Path) -> object:
    if not config_path.is_file():
        raise WideError(f"{config_path} not found",
                        hint="point at the folder written by `wide-export onnx --output DIR`")
    confined(config_path, config_path.parent, "model description")
    return read_json(config_path, hint="re-export the model with `wide-export onnx`")


def parse_model_shape(cfg: object, config_path: Path) -> ModelShape:
    """Validate wide_config.json fields (already parsed); `config_path` names them in errors."""
    if not isinstance(cfg, dict):
        raise WideError(f"{config_path}: expected a JSON object")
    shape = ModelShape(
        num_layers=_int_field(cfg, ("num_layers", "num_hidden_layers"), config_path),
        num_kv_heads=_int_field(cfg, ("num_key_value_heads",), config_path),
        head_dim=_int_field(cfg, ("head_dim",), config_path),
        vocab_size=_int_field(cfg, ("vocab_size",), config_path),
        kv_dtype=kv_dtype_name(cfg.get("dtype", "float32"), config_path),
        max_position_embeddings=_int_field(cfg, ("max_position_embeddings",), config_path),
    )
    check_limits(shape, config_path)
    return shape


# One sequence's KV cache at the model's length limit must fit some machine: 1 TiB is far above any
# accelerator's memory (a 70B model at 128k positions needs 43 GB) and far below what a hostile
# max_position_embeddings of 10^12 asks for, which would switch the server's length limit off.
KV_CACHE_MAX_BYTES = 1 << 40
# Token ids are int32 in tokenizers and onnxruntime-genai; a larger vocabulary cannot be real.
VOCAB_MAX = 2**31 - 1


def check_limits(shape: ModelShape, where: Path) -> None:
    """Refuse a vocabulary or length limit that no tokenizer or KV cache could hold."""
    if shape.vocab_size > VOCAB_MAX:
        raise WideError(f"{where}: vocab_size {shape.vocab_size} is more than token ids can number ({VOCAB_MAX})",
                        hint="the model description is damaged; re-export the model with `wide-export onnx`")
    itemsize = 2 if shape.kv_dtype == "float16" else 4
    per_position = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * itemsize
    need = per_position * shape.max_position_embeddings
    if need > KV_CACHE_MAX_BYTES:
        raise WideError(f"{where}: max_position_embeddings {shape.max_position_embeddings} needs a "
                        f"{need / (1 << 40):.3g} TiB KV cache for one sequence, more than the "
                        f"{KV_CACHE_MAX_BYTES >> 40} TiB any server holds",
                        hint="the model description is damaged; re-export the model with `wide-export onnx`")


def check_vocab(shape: ModelShape, logits_dims: list, where: str) -> None:
    """The graph's or engine's logits width, when static, is the vocabulary size."""
    last = logits_dims[-1] if logits_dims else None
    if isinstance(last, int) and last > 0 and last != shape.vocab_size:
        raise WideError(f"{where}: logits have {last} values per token, the model description says "
                        f"vocab_size {shape.vocab_size}",
                        hint="the folder mixes files from different exports; re-export")


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
    folder = Path(folder)
    onnx_file = folder / ONNX_FILE
    if not onnx_file.is_file():
        from wide_export.base.folders import elsewhere

        raise WideError(f"{onnx_file} not found", hint=elsewhere(folder, "onnx", {"engines": "pass it as --engines DIR"})
                        or "point --onnx at the folder written by `wide-export onnx`")
    confined(onnx_file, folder, "model file")
    cfg = _read_config(folder / WIDE_CONFIG)
    shape = parse_model_shape(cfg, folder / WIDE_CONFIG)
    model = load_graph(onnx_file)
    inputs = [v.name for v in model.graph.input]
    outputs = [v.name for v in model.graph.output]
    check_io_names(inputs, outputs, shape.num_layers, DEFAULT_IO, str(onnx_file))
    _check_config_io(cfg, inputs, outputs, folder / WIDE_CONFIG)
    logits = next(v for v in model.graph.output if v.name == DEFAULT_IO["logits"])
    check_vocab(shape, [d.dim_value if d.HasField("dim_value") else None
                        for d in logits.type.tensor_type.shape.dim], str(onnx_file))
    data_files = external_data_files(model, onnx_file)
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
