"""A WIDE checkpoint opened without reading its weights: a placeholder model plus a weight source.

The placeholder model has the real module tree, shapes and dtypes, but every
parameter is a zero-stride view of one scalar, so it costs no memory and can be
traced. `WeightSource` then produces each parameter on demand, one tensor at a
time: read from the safetensors shard, cast to the export dtype and,
for LoRA-adapted projections, merged -- the same arithmetic, in the same order, as
the eager loader (loader.load_wide_model + lora.merge_lora), so bytes agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from wide_export.base.errors import WideError


@dataclass
class WeightSource:
    """Where every parameter of the placeholder model comes from (parameter name -> recipe)."""

    dtype: Any  # torch dtype of the base weights
    base: dict[str, tuple[Path, str]] = field(default_factory=dict)  # param -> (shard, checkpoint key)
    routers: dict[str, Any] = field(default_factory=dict)  # param -> tensor from router.pth (small)
    lora: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # param -> (A, B)
    lora_scale: float = 2.0
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    readers: dict[Path, Any] = field(default_factory=dict, repr=False)  # shard -> tensor_reader.ShardReader

    def names(self) -> list[str]:
        return [*self.base, *self.routers]

    def tensor(self, name: str):
        """The parameter `name` as the eager loader would hold it (a fresh torch tensor)."""
        if name in self.routers:
            return self.routers[name].float()
        shard, key = self.base[name]
        if shard not in self.readers:
            from wide_export.checkpoint.tensor_reader import ShardReader

            self.readers[shard] = ShardReader(shard)
        t = self.readers[shard].read(key, self.dtype)  # read and cast chunk by chunk: one copy in memory
        if name in self.lora:
            from wide_export.checkpoint.lora import merged

            a, b = self.lora[name]
            t = merged(t, a, b, self.lora_scale, name)
        return t

    def loader(self, name: str) -> Callable[[], Any]:
        return lambda: self.tensor(name)


def placeholder(shape, dtype):
    """A parameter of `shape` and `dtype` backed by one element (zero strides)."""
    import torch

    return torch.nn.Parameter(torch.zeros((), dtype=dtype).expand(*shape), requires_grad=False)


def skeleton_model(hf: Any, cfg, dtype):
    """WideForCausalLM with placeholder parameters (routing already filled in `cfg`)."""
    from wide_export.model.build import rope_inv_freq

    return placeholder_model(cfg, *rope_inv_freq(hf), dtype)


def placeholder_model(cfg, inv_freq, scaling: float, dtype):
    """WideForCausalLM of `cfg` with placeholder parameters and the given rotary frequencies."""
    import torch

    from wide_export.model.modeling import WideForCausalLM

    with torch.device("meta"):
        model = WideForCausalLM(cfg, torch.zeros_like(inv_freq), scaling)
    model.model.inv_freq = inv_freq
    done: dict[int, Any] = {}
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        *path, leaf = name.split(".")
        mod = model.get_submodule(".".join(path))
        if id(p) not in done:
            done[id(p)] = placeholder(p.shape, torch.float32 if ".router_" in name else dtype)
        setattr(mod, leaf, done[id(p)])
    return model.eval()


def shard_index(shards: list[Path]) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """checkpoint key -> (shard, shape), from the safetensors headers only."""
    from safetensors import safe_open

    index = {}
    for f in shards:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                index[key] = (f, tuple(st.get_slice(key).get_shape()))
    return index


def base_sources(model, index: dict[str, tuple[Path, tuple[int, ...]]]) -> dict[str, tuple[Path, str]]:
    """Map every base parameter of `model` to its checkpoint tensor, with the eager loader's checks."""
    params = dict(model.named_parameters(remove_duplicate=False))
    unknown, out = [], {}
    for key, (shard, shape) in index.items():
        if key not in params or ".router_" in key:
            if "rotary_emb" not in key:
                unknown.append(key)
            continue
        if tuple(params[key].shape) != shape:
            raise WideError(f"weight {key} has shape {list(shape)}, config.json implies "
                            f"{list(params[key].shape)}", "config.json does not match the weights")
        out[key] = (shard, key)
    if unknown:
        raise WideError(f"the checkpoint has {len(unknown)} tensors this architecture does not use, e.g. {unknown[0]}",
                        "config.json's model_type does not describe these weights")
    if model.config.tie_word_embeddings and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]  # one tensor, both names
    missing = [n for n in params if n not in out and ".router_" not in n]
    if missing:
        raise WideError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[0]}",
                        "the model folder is incomplete or of another architecture")
    return out


def open_lazy(hf: Any, cfg, shards: list[Path], routers: dict, dtype, lora: Path | None = None,
              lora_scale: float = 2.0):
    """(placeholder model, WeightSource) for a checkpoint; routers as read by router.read_routers."""
    model = skeleton_model(hf, cfg, dtype)
    source = WeightSource(dtype=dtype, base=base_sources(model, shard_index(shards)), lora_scale=lora_scale)
    for (layer, kind), tensors in routers.items():
        for key, tensor in tensors.items():
            source.routers[f"model.layers.{layer}.router_{kind}.{key}"] = tensor
    if lora:
        from wide_export.checkpoint.lora import lora_pairs

        source.lora = lora_pairs(model, Path(lora))
    source.shapes = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    return model, source
