"""A vLLM folder from anywhere, checked before vLLM reads it: confined to itself, finite, refused in one line.

`check_folder` is what `wide-export vllm` runs on the folder it has just written, what
`wide-export vllm --check DIR` and `wide-vllm serve DIR` run before vLLM starts, and what the plugin runs
inside vLLM (guard.py) once vLLM has read config.json and before it opens any other file of the folder:

* every entry of the folder resolves inside it, symlinks followed (paths.confined), so neither the weights,
  the index, the tokenizer files, generation_config.json nor a chat template can be a link to a file
  elsewhere; the one exception is base/paths.py's: a Hugging Face cache snapshot's links into the same
  repository's `blobs/`;
* config.json's `wide` section is one the plugin builds (spec.config_from_hf: formats, group counts,
  router ranks at most the hidden size, a finite LoRA scale);
* the safetensors files vLLM will read (the index's, else every `*.safetensors`) have headers that parse and
  data that the files hold whole (a truncated shard is named, not left to safetensors' own error);
* the router tensors are those the section describes, float32, and finite.

No vLLM import: it runs in the writer's environment too. Every refusal is a WideError (one line + hint).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from wide_export.base.errors import WideError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
MAX_ENTRIES = 10_000  # a model folder holds tens of files; a walk stops here
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
TOKENIZER_NAMES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _hint() -> str:
    from wide_export.vllm.spec import HINT

    return HINT


def check_confined(folder: Path) -> int:
    """Every entry under `folder` resolves inside it (or its Hugging Face blob store); returns the count."""
    from wide_export.base.paths import confined

    count = 0
    for root, dirs, files in os.walk(folder):  # symlinked folders are listed, not entered: confined() checks them
        for name in [*dirs, *files]:
            count += 1
            if count > MAX_ENTRIES:
                raise WideError(f"{folder} holds more than {MAX_ENTRIES} files and folders",
                                "pass the folder `wide-export vllm` wrote, not a folder above it")
            confined(Path(root) / name, folder, "the folder's file")
    return count


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files vLLM reads: those the index names, else every `*.safetensors` of the folder."""
    from wide_export.base.paths import read_json

    index = folder / INDEX
    if index.is_file():
        data = read_json(index, hint=_hint())
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise WideError(f"{index} has no weight_map of tensor names to file names", _hint())
        names = sorted(set(weight_map.values()))
        for name in names:
            if Path(name).name != name or not name.endswith(".safetensors"):
                raise WideError(f"{index} names {name!r}, not a safetensors file of the folder", _hint())
    else:
        names = sorted(p.name for p in folder.glob("*.safetensors"))
    files = [folder / n for n in names]
    if not files:
        raise WideError(f"{folder} holds no safetensors weights", _hint())
    for f in files:
        if not f.is_file():
            raise WideError(f"{folder} lacks {f.name}, which its index names", "copy the whole folder")
    return files


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """tensor name -> {dtype, shape, data_offsets} of a safetensors file, checked against the file's size."""
    from wide_export.base.paths import parse_json

    hint = f"{path.name} is truncated or damaged: copy the folder again, or {_hint()}"
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WideError(f"{path} is {size} bytes, too short for a safetensors file", hint)
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise WideError(f"{path}: its header claims {n} bytes, the file holds {size - 8} after the length",
                            hint)
        header = parse_json(f.read(n), f"{path}'s header", hint)
    if not isinstance(header, dict):
        raise WideError(f"{path}'s header is not a JSON object", hint)
    data = size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(info, dict) and info.get("dtype") in ST_BYTES and isinstance(info.get("shape"), list)
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in info["shape"])
              and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in info["data_offsets"]))
        if not ok:
            raise WideError(f"{path}: tensor {name!r} has a malformed header entry", hint)
        start, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        if not 0 <= start <= end or end - start != count * ST_BYTES[info["dtype"]]:
            raise WideError(f"{path}: tensor {name!r} has offsets {start}..{end} that do not fit its shape "
                            f"{info['shape']} {info['dtype']}", hint)
        if end > data:
            raise WideError(f"{path} is truncated: tensor {name!r} ends at byte {end} of the data, the file holds "
                            f"{data}", hint)
        out[name] = info
    return out


def check_routers(folder: Path, cfg, headers: dict[str, tuple[Path, dict]]) -> int:
    """The router tensors are exactly those the section describes: shape, float32, finite. Returns the count."""
    from safetensors import safe_open

    from wide_export.checkpoint.router import check_finite
    from wide_export.vllm.spec import router_shapes

    want = {}
    for i, r in enumerate(cfg.routing):
        for kind, groups in (("attention", r.attn_groups), ("ffn", r.ffn_groups)):
            if groups is not None:
                want.update({f"model.layers.{i}.router_{kind}.{k}": s for k, s in router_shapes(cfg, i, kind).items()})
    got = {k: v for k, v in headers.items() if ".router_" in k}
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    if extra:
        raise WideError(f"the folder holds {extra[0]}, which its config.json `wide` section does not describe",
                        _hint())
    if missing:
        raise WideError(f"the folder lacks {len(missing)} router tensors its config.json describes, "
                        f"e.g. {missing[0]}", _hint())
    for name, (path, info) in sorted(got.items()):
        if tuple(info["shape"]) != tuple(want[name]):
            raise WideError(f"{name} has shape {info['shape']} in the folder, its config.json `wide` section "
                            f"implies {list(want[name])}", _hint())
        if info["dtype"] != "F32":
            raise WideError(f"{name} is {info['dtype']} in the folder; router tensors are float32 "
                            "(config.json `wide.router_dtype`)", _hint())
    by_file: dict[Path, list[str]] = {}
    for name, (path, _) in got.items():
        by_file.setdefault(path, []).append(name)
    for path, names in sorted(by_file.items()):
        with safe_open(str(path), framework="pt") as st:
            for name in sorted(names):
                check_finite(st.get_tensor(name), name, f"the folder's routers are damaged; {_hint()}")
    return len(got)


def check_folder(folder: Path | str, hf=None) -> dict[str, Any]:
    """Check a WIDE vLLM folder before vLLM reads it (see the module's docstring); WideError on the first
    problem. `hf`: its transformers config when the caller holds it already (vLLM has parsed config.json).
    Returns {"files", "weights", "routers", "tokenizer"}."""
    from wide_export.base.paths import confined, read_json
    from wide_export.vllm.spec import config_from_hf

    folder = Path(folder)
    if not folder.is_dir():
        raise WideError(f"{folder} is not a folder", "pass the folder `wide-export vllm --output` wrote")
    if not (folder / CONFIG).is_file():
        raise WideError(f"{folder} has no config.json", "pass the folder `wide-export vllm --output` wrote")
    files = check_confined(folder)
    confined(folder / CONFIG, folder, "config file")
    if hf is None:
        from transformers import AutoConfig

        raw = read_json(folder / CONFIG, hint=_hint())  # size and depth limits before transformers parses it
        if not isinstance(raw, dict):
            raise WideError(f"{folder / CONFIG} is not a JSON object", _hint())
        try:
            hf = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        except (ValueError, KeyError, TypeError, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WideError(f"{folder / CONFIG} is not a config transformers reads: {first[:200]}", _hint()) from None
    cfg = config_from_hf(hf)
    headers: dict[str, tuple[Path, dict]] = {}
    weights = weight_files(folder)
    for path in weights:
        headers.update({k: (path, v) for k, v in read_header(path).items()})
    routers = check_routers(folder, cfg, headers)
    tokenizer = any((folder / n).is_file() for n in TOKENIZER_NAMES)
    return {"files": files, "weights": [p.name for p in weights], "routers": routers, "tokenizer": tokenizer}


def is_wide_folder(folder: Path | str) -> bool:
    """Whether `folder` is a local folder whose config.json carries a `wide` section (cheap; no checks)."""
    from wide_export.base.paths import confined

    path = Path(folder) / CONFIG
    try:
        confined(path, Path(folder), "config file")
    except WideError:
        return True  # not read here: check_folder refuses it
    try:
        if not path.is_file() or path.stat().st_size > (64 << 20):
            return False
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(raw, dict) and isinstance(raw.get("wide"), dict)
