"""Random-weight WIDE checkpoints of real sizes on disk (1B, 8B), written shard by shard.

model.synthetic.write_checkpoint holds the whole float32 state in memory; at 8B
that is 32 GB. This writer makes one tensor at a time and flushes a safetensors
shard every `shard_bytes`, in the dtype the trainer ships (bfloat16), with the
Hugging Face index file, so a 16 GB checkpoint is written with ~2 GB of RAM.
"""

from __future__ import annotations

import json
from pathlib import Path

from wide_export.model.synthetic import HF_MODELS, SyntheticSpec, random_router_state

SHARD_BYTES = 2 << 30


def _named_shapes(spec: SyntheticSpec) -> list[tuple[str, tuple[int, ...]]]:
    import torch
    import transformers

    with torch.device("meta"):
        hf_model = getattr(transformers, HF_MODELS[spec.arch])(spec.hf_config())
    items = [(n, tuple(p.shape)) for n, p in hf_model.state_dict().items()]
    if spec.tie_word_embeddings:
        items = [(n, s) for n, s in items if n != "lm_head.weight"]
    return items


def _random(name: str, shape: tuple[int, ...], g, dtype):
    import torch

    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * torch.randn(shape, generator=g)).to(dtype)
    if name.endswith(".bias"):
        return (0.1 * torch.randn(shape, generator=g)).to(dtype)
    t = torch.randn(shape, generator=g, dtype=torch.float32)
    if "embed_tokens" not in name:
        t.mul_(shape[-1] ** -0.5)
    return t.to(dtype)


def write_sharded_checkpoint(folder: Path, spec: SyntheticSpec, dtype: str = "bfloat16",
                             shard_bytes: int = SHARD_BYTES) -> Path:
    """HF folder (config.json, model-0000i-of-0000n.safetensors + index) + router.pth, random weights."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    spec.hf_config().save_pretrained(folder)
    g = torch.Generator().manual_seed(spec.seed)
    shards: list[None] = [None]  # one entry per shard written, plus one
    weight_map: dict[str, int] = {}
    pending: dict[str, torch.Tensor] = {}
    size = total = 0

    def flush() -> None:
        nonlocal pending, size
        if pending:
            save_file(pending, str(folder / f"shard-{len(shards):05d}.safetensors"), metadata={"format": "pt"})
            shards.append(None)
        pending, size = {}, 0

    for name, shape in _named_shapes(spec):
        t = _random(name, shape, g, torch_dtype)
        if size and size + t.nbytes > shard_bytes:
            flush()
        pending[name] = t
        size += t.nbytes
        total += t.nbytes
        weight_map[name] = len(shards)
    flush()
    n = len(shards) - 1
    names = {i: f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)}
    for i in range(1, n + 1):
        (folder / f"shard-{i:05d}.safetensors").rename(folder / names[i])
    index = {"metadata": {"total_size": total}, "weight_map": {k: names[v] for k, v in weight_map.items()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    torch.save(random_router_state(spec, "_fsdp_wrapped_module.base_model.model.", torch.bfloat16),
               folder / "router.pth")
    return folder
