"""Reference side of a verification: prompts, feeds and the PyTorch outputs per step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wide_export.ops.io_spec import mask_output_name


@dataclass
class Step:
    """One inference step: the feed (numpy, graph names) and the reference outputs."""

    feed: dict[str, np.ndarray]
    ref: dict[str, np.ndarray]
    margins: dict[str, np.ndarray] = field(default_factory=dict)  # mask name -> float32 margin
    hidden: list[np.ndarray] = field(default_factory=list)  # residual stream entering each layer, then the head


def left_padded_prompts(vocab: int, batch: int, length: int, seed: int):
    """Random prompts; row 0 is left-padded by a third of its length when batch > 1."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[0, : max(1, length // 3)] = 0
    return ids, mask


def reference_steps(model, *, batch: int, prompt_len: int, steps: int, seed: int, kv_dtype: str) -> list[Step]:
    """Prefill then `steps` greedy decode steps of the reference; feeds carry a zero-length past first.

    The *graph under test* must be fed its own `present` outputs as the next past; the
    feeds here hold the reference cache only for the first step (empty), see run_steps().
    """
    import torch

    from wide_export.generation.decoding import decode_loop
    from wide_export.generation.torch_step import TorchStep
    from wide_export.model.modeling import Collector

    cfg = model.config
    ids, mask = left_padded_prompts(cfg.vocab_size, batch, prompt_len, seed)
    step = TorchStep(model, model.empty_cache(batch))
    out: list[Step] = []
    if kv_dtype == "bfloat16":
        from wide_export.verify.evaluator import bfloat16

        np_kv = bfloat16()
    else:
        np_kv = np.float16 if kv_dtype == "float16" else np.float32
    hidden: list[np.ndarray] = []  # this step's residual stream entering each layer, then the final norm

    def recorded(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray):
        """The step of the one generation loop, its feed and every output kept."""
        step.collect = collect = Collector()
        hidden.clear()
        logits = step(ids, mask, pos)
        feed = {"input_ids": ids, "attention_mask": mask, "position_ids": pos}
        ref = {"logits": logits.numpy()}
        for i, (k, v) in enumerate(step.past):
            ref[f"present.{i}.key"], ref[f"present.{i}.value"] = k.float().numpy(), v.float().numpy()
        margins = {}
        for i, (masks, mrg) in enumerate(zip(collect.masks, collect.margins)):
            for kind, m in masks.items():
                ref[mask_output_name(i, kind)] = m.numpy().astype(np.int32)
                margins[mask_output_name(i, kind)] = mrg[kind].numpy()
        out.append(Step(feed, ref, margins, list(hidden)))
        return logits

    hooks = [m.register_forward_pre_hook(lambda module, args: hidden.append(args[0].float().numpy()))
             for m in [*model.model.layers, model.model.norm]]
    try:
        with torch.no_grad():
            decode_loop(recorded, ids.numpy(), mask.numpy(), steps + 1)
    finally:
        for hook in hooks:
            hook.remove()
    # the first feed's (empty) past; later pasts come from the graph's own presents
    empty = np.zeros((batch, cfg.num_key_value_heads, 0, cfg.head_dim), dtype=np_kv)
    for i in range(cfg.num_layers):
        out[0].feed[f"past_key_values.{i}.key"] = empty
        out[0].feed[f"past_key_values.{i}.value"] = empty
    return out


def streamed(loaded):
    """The reference model of `loaded` (load_wide_model(lazy=True), float32) with weights read per module.

    The model holds placeholders (checkpoint/lazy.py). Before the embedding, each decoder layer, the final
    norm and lm_head run, their parameters are read from the checkpoint (WeightSource: the eager loader's
    cast and LoRA merge); afterwards the placeholders are put back. So at most one of these modules'
    float32 weights is in memory at a time, and every step reads them again.
    """
    model, weights = loaded.model, loaded.weights
    units = [("model.embed_tokens", model.model.embed_tokens), ("model.norm", model.model.norm),
             ("lm_head", model.lm_head)]
    units += [(f"model.layers.{i}", layer) for i, layer in enumerate(model.model.layers)]
    for prefix, module in units:
        held: dict[str, object] = {}
        module.register_forward_pre_hook(lambda mod, args, prefix=prefix, held=held: _load(mod, prefix, weights,
                                                                                             held))
        module.register_forward_hook(lambda mod, args, out, held=held: _unload(mod, held))
    return model


def _load(module, prefix: str, weights, held: dict) -> None:
    import torch

    for name, param in list(module.named_parameters(remove_duplicate=False)):
        owner, leaf = _owner(module, name)
        held[name] = param
        setattr(owner, leaf, torch.nn.Parameter(weights.tensor(f"{prefix}.{name}").float(), requires_grad=False))


def _unload(module, held: dict) -> None:
    for name, placeholder in held.items():
        owner, leaf = _owner(module, name)
        setattr(owner, leaf, placeholder)
    held.clear()


def _owner(module, name: str):
    *path, leaf = name.split(".")
    return (module.get_submodule(".".join(path)) if path else module), leaf
