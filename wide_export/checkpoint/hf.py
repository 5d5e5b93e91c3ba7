"""The Hugging Face folder: config.json and safetensors shards (read tensor by tensor)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

from wide_export.base.errors import WideError
from wide_export.model.arch import arch_for
from wide_export.base.paths import confined, parse_json, read_json


# Files a Hugging Face folder keeps next to its weights that a generator needs (tokenizer + defaults):
# `wide-export onnx` copies them into the export (export/genai_config.py).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
)


def check_companion_files(model_dir: Path) -> None:
    """The tokenizer files present lie inside the folder (or its Hugging Face blob store): a symlink
    elsewhere is refused when the folder is read, not after minutes of export."""
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            confined(model_dir / name, model_dir, "tokenizer file")


def read_hf_config(model_dir: Path) -> Any:
    """The transformers config of a local folder, refusing unsupported models first."""
    from wide_export.base.inputs import check_model_folder

    model_dir = Path(model_dir)
    check_model_folder(model_dir)  # the same lines the CLI gives while parsing --model
    cfg_path = model_dir / "config.json"
    confined(cfg_path, model_dir, "config file")
    raw = read_json(cfg_path, hint="the model folder looks damaged")
    check_config_values(raw, cfg_path)
    if isinstance(raw.get("wide"), dict):  # written by `wide-export vllm`: LoRA merged, routers inside
        from wide_export.base.folders import elsewhere

        raise WideError(f"--model {model_dir} is not a checkpoint of the WIDE trainer",
                        elsewhere(model_dir, "model") or "pass the Hugging Face folder with its router.pth")
    arch_for(raw.get("model_type"))  # refuse unknown architectures before transformers sees them
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)


# The config.json values the runtime computes with, one rule each: (key, kind, optional, example); every one
# must be positive and finite. A key "a.b" is the field b of the object a (transformers 5's rope_parameters,
# the older rope_scaling). Integer sizes are at most SIZE_MAX: GGUF stores them as uint32 and the kernels
# index positions and rows with int32.
SIZE_MAX = 2**31 - 1
_CONFIG_RULES: tuple[tuple[str, type, bool, str], ...] = (
    ("vocab_size", int, False, "32000"),
    ("hidden_size", int, False, "512"),
    ("intermediate_size", int, False, "1376"),
    ("num_hidden_layers", int, False, "16"),
    ("num_attention_heads", int, False, "8"),
    ("num_key_value_heads", int, True, "8"),
    ("head_dim", int, True, "64"),
    ("max_position_embeddings", int, True, "4096"),
    ("rms_norm_eps", float, True, "1e-06"),
    ("rope_theta", float, True, "10000.0"),
    *((f"{group}.{key}", float, True, example) for group in ("rope_parameters", "rope_scaling")
      for key, example in (("rope_theta", "10000.0"), ("factor", "8.0"))),
)


def _config_value(raw: dict, key: str) -> tuple[bool, Any]:
    """(present, value) of a rule's key in config.json."""
    outer, _, inner = key.partition(".")
    if not inner:
        return key in raw, raw.get(key)
    group = raw.get(outer)
    return (isinstance(group, dict) and inner in group), (group.get(inner) if isinstance(group, dict) else None)


def _positive(value: int | float) -> bool:
    """> 0 and finite (an int is: math.isfinite would overflow on 10**400)."""
    return value > 0 and (isinstance(value, int) or math.isfinite(value))


def check_config_values(raw: Any, cfg_path: Path) -> None:
    """Refuse a config.json that is not an object, or a value of _CONFIG_RULES of the wrong type, not finite,
    not positive or too large (a NaN epsilon, rope_theta 0, 10**12 positions), naming the file and the key."""
    if not isinstance(raw, dict):
        raise WideError(f"{cfg_path} holds a JSON {type(raw).__name__}, not an object",
                        "the model folder looks damaged; config.json must be the model's transformers config")
    for key, kind, optional, example in _CONFIG_RULES:
        present, value = _config_value(raw, key)
        if value is None and optional:
            continue  # derived from the others, or a default
        hint = f"fix {key} in config.json (a number without quotes, e.g. \"{key.split('.')[-1]}\": {example})"
        numeric = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if isinstance(value, bool) or not numeric or not _positive(value):
            what = "a positive integer" if kind is int else "a number greater than 0"
            got = "nothing" if not present else f"{repr(value)[:40]} ({type(value).__name__})"
            raise WideError(f"{cfg_path}: {key} must be {what}, got {got}", hint)
        if kind is int and value > SIZE_MAX:
            raise WideError(f"{cfg_path}: {key} is {str(value)[:40]}, more than the {SIZE_MAX} a GGUF file and the "
                            "kernels' int32 indices hold", hint)


# The safetensors library refuses headers above 100 MB (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
SAFETENSORS_HEADER_MAX = 100_000_000


def check_safetensors(path: Path) -> None:
    """Refuse an empty, truncated or garbled safetensors file from its header, before loading anything.

    Format: 8-byte little-endian header length, a JSON header, then the tensor bytes; every
    tensor's data_offsets must lie within the file.
    """
    import struct

    hint = "the file is damaged or incompletely downloaded; download it again"
    size = path.stat().st_size
    if size < 8:
        raise WideError(f"{path} is damaged: {'empty' if size == 0 else f'only {size} bytes'}", hint)
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if 8 + header_len > size:
            raise WideError(f"{path} is truncated: its header needs {header_len} bytes, the file has "
                            f"{size - 8} after the length", hint)
        if header_len > SAFETENSORS_HEADER_MAX:
            raise WideError(f"{path} is damaged: its header claims {header_len} bytes, more than the "
                            f"{SAFETENSORS_HEADER_MAX} safetensors allows", hint)
        header = parse_json(f.read(header_len), f"{path} header", hint)
    if not isinstance(header, dict):
        raise WideError(f"{path} is damaged: its header is not a JSON object", hint)
    data = size - 8 - header_len
    need = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            need = max(need, int(end))
        except (TypeError, KeyError, ValueError):
            raise WideError(f"{path} is damaged: tensor {name!r} has no valid data_offsets", hint) from None
    if need > data:
        raise WideError(f"{path} is truncated: its tensors need {need} bytes of data, the file has {data}", hint)
    from safetensors import SafetensorError, safe_open

    try:  # the format library's own header checks (dtypes, shapes vs offsets, metadata types)
        with safe_open(str(path), framework="pt"):
            pass
    except SafetensorError as err:
        raise WideError(f"{path} is damaged: {str(err).splitlines()[0][:200]}", hint) from None


def safetensors_files(model_dir: Path) -> list[Path]:
    """All weight shards of the folder (index-listed or globbed)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        confined(index, model_dir, "weight index")
        hint = "download the complete model folder again"
        raw = read_json(index, hint=hint)
        try:
            names = sorted(set(raw["weight_map"].values()))
        except (TypeError, KeyError, AttributeError):
            raise WideError(f"{index} is damaged (no readable weight_map)", hint) from None
        if not all(isinstance(n, str) for n in names):
            raise WideError(f"{index} is damaged (a weight_map entry is not a file name)", hint)
        files = [model_dir / n for n in names]
        for f in files:
            confined(f, model_dir, f"weight shard listed in {index.name}:")
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WideError(f"{model_dir}: shards listed in the index are missing: {', '.join(missing[:3])}",
                            "download the complete model folder")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        for f in files:
            confined(f, model_dir, "weight shard")
    if not files:
        raise WideError(f"{model_dir} has no *.safetensors weights",
                        "save the model with save_pretrained(safe_serialization=True); .bin pickles are not read")
    for f in files:
        check_safetensors(f)  # a damaged shard is named before minutes of loading
    return files


def check_layer_count(files: list[Path], num_layers: int, where: Path) -> None:
    """Every decoder layer config.json announces has weights (`model.layers.N.*`), checked from the
    shard headers before any module is built: a wrong num_hidden_layers (1000000) fails here, not after
    building a million decoder layers."""
    import re

    from safetensors import safe_open

    layer = re.compile(r"(?:^|\.)layers\.(\d+)\.")
    present: set[int] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            present.update(int(m.group(1)) for key in st.keys() if (m := layer.search(key)))
    missing = next((i for i in range(num_layers) if i not in present), None)
    if missing is not None:
        raise WideError(f"{where}: num_hidden_layers is {num_layers}, but the weights have no "
                        f"model.layers.{missing}.* tensors ({len(present)} layers present)",
                        "config.json does not match the weights: fix num_hidden_layers or download the "
                        "complete model folder")


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor, one at a time (memory-mapped)."""
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
