"""The Hugging Face folder: config.json and safetensors shards (read tensor by tensor)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from wide_export.errors import WideError
from wide_export.model.arch import arch_for


def read_hf_config(model_dir: Path) -> Any:
    """The transformers config of a local folder, refusing unsupported models first."""
    model_dir = Path(model_dir)
    if model_dir.exists() and not model_dir.is_dir():
        raise WideError(f"--model {model_dir} is a file, not a folder",
                        f"pass the Hugging Face model folder that holds it: --model {model_dir.parent}")
    if not model_dir.is_dir():
        raise WideError(f"model folder not found: {model_dir}", "pass --model DIR, a Hugging Face model folder")
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise WideError(f"{model_dir} has no config.json",
                        "pass a Hugging Face causal-LM folder (config.json + *.safetensors)")
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as err:
        raise WideError(f"cannot parse {cfg_path}: {err}", "the model folder looks damaged") from None
    check_config_values(raw, cfg_path)
    arch_for(raw.get("model_type"))  # refuse unknown architectures before transformers sees them
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)


# config.json fields read as sizes / numbers: a wrong type would fail deep inside transformers or torch.
_POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings")
_OPTIONAL = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_NUMBERS = ("rms_norm_eps", "rope_theta")


def check_config_values(raw: Any, cfg_path: Path) -> None:
    """Refuse a config.json that is not an object, or whose sizes are not positive integers."""
    if not isinstance(raw, dict):
        raise WideError(f"{cfg_path} holds a JSON {type(raw).__name__}, not an object",
                        "the model folder looks damaged; config.json must be the model's transformers config")
    for key in _POSITIVE_INTS:
        value = raw.get(key)
        if value is None and key in _OPTIONAL:
            continue  # derived from the others
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            what = "nothing" if key not in raw else f"{value!r} ({type(value).__name__})"
            raise WideError(f"{cfg_path}: {key} must be a positive integer, got {what}",
                            f"fix {key} in config.json (a number without quotes, e.g. \"{key}\": 512)")
    for key in _NUMBERS:
        value = raw.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise WideError(f"{cfg_path}: {key} must be a number, got {value!r} ({type(value).__name__})",
                            f"fix {key} in config.json")


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
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, UnicodeDecodeError):
            raise WideError(f"{path} is damaged: its header is not valid JSON", hint) from None
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


def safetensors_files(model_dir: Path) -> list[Path]:
    """All weight shards of the folder (index-listed or globbed)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            raise WideError(f"{index} is damaged (no readable weight_map)", "download the complete model "
                            "folder again") from None
        files = [model_dir / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise WideError(f"{model_dir}: shards listed in the index are missing: {', '.join(missing[:3])}",
                            "download the complete model folder")
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WideError(f"{model_dir} has no *.safetensors weights",
                        "save the model with save_pretrained(safe_serialization=True); .bin pickles are not read")
    for f in files:
        check_safetensors(f)  # a damaged shard is named before minutes of loading
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """(name, tensor) for every tensor, one at a time (memory-mapped)."""
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
