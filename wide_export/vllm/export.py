"""`wide-export vllm`: write a self-contained folder that vLLM (with our plugin) runs as it is.

The weights are streamed as `wide-export onnx` streams them: the loader opens the
checkpoint lazily, and every tensor is read from its memory-mapped shard, cast,
LoRA-merged (checkpoint/lazy.py) and written into a safetensors shard of at most
`max_shard_bytes` (2 GiB); safetensors serialises a shard whole before writing
it, so peak memory is about two shards, whatever the model's size. Routers are written in
float32 under the trainer's names. The folder's contract is spec.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 2 << 30


def source_dtype(model_dir: Path | None) -> str:
    """The checkpoint's own dtype (config.json `dtype` / `torch_dtype`), float32 when it names none we write."""
    if model_dir is None:
        return "float32"
    from wide_export.checkpoint.hf import read_hf_config
    from wide_export.base.paths import read_json

    read_hf_config(Path(model_dir))  # the loader's checks and one-line errors first (no folder, no config, ...)
    raw = read_json(Path(model_dir) / CONFIG, hint="the model folder looks damaged")
    value = raw.get("dtype") or raw.get("torch_dtype") if isinstance(raw, dict) else None
    return value if value in ("float32", "float16", "bfloat16") else "float32"


def base_config(loaded) -> dict[str, Any]:
    """The base model's config.json as a dict (the demo's from its spec)."""
    if loaded.model_dir is None:
        from wide_export.model.demo import DEMO_SPEC

        return DEMO_SPEC.hf_config().to_dict()
    from wide_export.base.paths import confined, read_json

    path = confined(Path(loaded.model_dir) / CONFIG, Path(loaded.model_dir), "config file")
    return dict(read_json(path, hint="the model folder looks damaged"))


def folder_config(loaded, dtype: str) -> dict[str, Any]:
    """config.json of the vLLM folder: the base config, our architecture name, the dtype, the `wide` section."""
    from wide_export.model.arch import arch_for
    from wide_export.vllm.spec import SECTION, wide_section

    cfg = loaded.config
    out = base_config(loaded)
    out["architectures"] = [arch_for(cfg.model_type).vllm_architecture]
    out["dtype"] = dtype
    if "torch_dtype" in out:
        out["torch_dtype"] = dtype
    out.pop("auto_map", None)  # remote code is never run: the plugin is the implementation
    out[SECTION] = wide_section(cfg, dtype=dtype, sources=loaded.sources, lora_pairs=loaded.lora_pairs,
                                lora_scale=loaded.lora_scale, demo=loaded.is_demo)
    return out


def parameter_names(loaded, routers: bool = True) -> list[str]:
    """The parameters the folder holds: a tied lm_head is not written (vLLM ties it, as transformers);
    routers=False: the dense twin's (the same base weights, no routers)."""
    tied = loaded.config.tie_word_embeddings
    names = (loaded.weights.names() if loaded.weights is not None
             else [n for n, _ in loaded.model.named_parameters()])  # the in-memory demo (tied names once)
    return [n for n in names if not (tied and n == "lm_head.weight") and (routers or ".router_" not in n)]


def tensors(loaded, routers: bool = True) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every parameter the folder holds, one at a time: base weights in the export dtype
    with LoRA merged, routers in float32."""
    if loaded.weights is not None:  # lazy: read one tensor at a time
        for name in parameter_names(loaded, routers):
            yield name, loaded.weights.tensor(name)
        return
    params = dict(loaded.model.named_parameters())
    for name in parameter_names(loaded, routers):
        yield name, params[name].detach()


def write_weights(loaded, folder: Path, progress=None, max_shard_bytes: int = MAX_SHARD_BYTES,
                  routers: bool = True) -> list[str]:
    """Write the tensors into safetensors shards (one file, or numbered shards + index); returns file names."""
    from safetensors.torch import save_file

    total = len(parameter_names(loaded, routers))
    shards: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    size = 0
    names_of: list[list[str]] = []
    written = 0

    def flush() -> None:
        nonlocal current, size
        if not current:
            return
        path = folder / f".shard-{len(names_of):05d}.safetensors"
        save_file({k: v.contiguous() for k, v in current.items()}, str(path), metadata={"format": "pt"})
        names_of.append(list(current))
        shards.append({"path": path, "bytes": size})
        current, size = {}, 0

    for name, t in tensors(loaded, routers):
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            flush()
        current[name] = t
        size += nbytes
        written += 1
        if progress:
            progress(f"weights {written}/{total}")
    flush()
    if len(shards) == 1:
        shards[0]["path"].rename(folder / SINGLE)
        return [SINGLE]
    files, weight_map = [], {}
    for i, (shard, names) in enumerate(zip(shards, names_of)):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        shard["path"].rename(folder / name)
        files.append(name)
        weight_map.update({n: name for n in names})
    index = {"metadata": {"total_size": sum(s["bytes"] for s in shards)}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*files, INDEX]


def write_text_files(loaded, folder: Path) -> list[str]:
    """The tokenizer, chat template and generation_config of the model folder (the demo's byte tokenizer)."""
    if loaded.model_dir is None:
        from wide_export.model.demo_tokenizer import write_demo_tokenizer

        return write_demo_tokenizer(folder)
    from wide_export.export.genai_config import tokenizer_files
    from wide_export.base.paths import copy_confined

    copied = []
    for path in tokenizer_files(loaded):  # each confined to the model folder, and copied from the checked file
        copy_confined(path, folder / path.name, Path(loaded.model_dir), "tokenizer file")
        copied.append(path.name)
    return copied


def export_dense_twin(loaded, folder: Path, dtype: str, max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """The same weights as a plain model of the family (vLLM's own class, no routers): the baseline of
    `wide-export bench vllm` and gpu-check's vLLM stage."""
    from wide_export.model.arch import arch_for

    write_weights(loaded, folder, max_shard_bytes=max_shard_bytes, routers=False)
    write_text_files(loaded, folder)
    config = folder_config(loaded, dtype)
    config.pop("wide")
    config["architectures"] = [arch_for(loaded.config.model_type).hf_model_class]
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def export_vllm(loaded, folder: Path, dtype: str, stages=None, max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """Write the vLLM folder of `loaded` into `folder` (an empty staging folder); returns a summary."""
    from wide_export.export.provenance import hash_in_background

    say = stages.update if stages is not None else None
    hashing = hash_in_background(loaded.sources)
    files = write_weights(loaded, folder, say, max_shard_bytes)
    text = write_text_files(loaded, folder)
    if hashing is not None:
        hashing.result()
    (folder / CONFIG).write_text(json.dumps(folder_config(loaded, dtype), indent=2, allow_nan=False) + "\n")
    from wide_export.vllm.check import check_folder as check

    summary = check(folder)
    return {"weights": files, "text": text, "routers": summary["routers"], "tokenizer": summary["tokenizer"]}
