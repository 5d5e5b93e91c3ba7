"""Checkpoint loading details: sharded safetensors, wrapper prefixes, bf16 router files, the demo."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from tests.helpers import make_checkpoint
from wide_export.checkpoint import load_wide_model


def _shard(folder):
    """Rewrite model.safetensors as two shards + model.safetensors.index.json (as save_pretrained does)."""
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), start=1):
        fname = f"model-0000{i}-of-00002.safetensors"
        save_file({n: state[n] for n in part}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_loads_the_same_weights(tmp_path):
    one = make_checkpoint(tmp_path / "one", arch="qwen2", seed=3)
    two = make_checkpoint(tmp_path / "two", arch="qwen2", seed=3)
    _shard(two)
    a, b = load_wide_model(one), load_wide_model(two)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert sum(k.startswith("weights:") for k in b.sources) == 2


def test_router_prefix_is_stripped_and_bf16_routers_become_float32(tmp_path):
    folder = make_checkpoint(tmp_path, arch="llama")
    raw = torch.load(folder / "router.pth", weights_only=True)
    key = "_fsdp_wrapped_module.base_model.model.model.layers.1.router_ffn.router.weight"
    assert key in raw and raw[key].dtype == torch.bfloat16  # what the trainer writes
    model = load_wide_model(folder).model
    loaded = model.model.layers[1].router_ffn.router.weight
    assert loaded.dtype == torch.float32
    assert torch.equal(loaded, raw[key].float())
    assert model.config.routing[1].ffn_groups == raw[key].shape[0] // 2


def test_demo_model_is_deterministic_and_routed():
    a, b = load_wide_model().model, load_wide_model().model
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    cfg = a.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    assert all(r.attn_groups and r.ffn_groups for r in cfg.routing)  # both routers everywhere
