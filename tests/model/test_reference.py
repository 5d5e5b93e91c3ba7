"""The PyTorch reference against plain transformers with every router forced to execute."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.helpers import make_checkpoint
from tests.model.hf_routing import hand_route, read_routers
from wide_export.checkpoint import load_wide_model
from wide_export.generation.decoding import positions
from wide_export.generation.torch_step import greedy_generate
from wide_export.model.modeling import Collector

ARCHS = [
    dict(arch="llama"),
    dict(arch="llama", tie_word_embeddings=True, num_kv_heads=8),
    dict(arch="mistral"),
    dict(arch="qwen2"),
    dict(arch="qwen3", head_dim=16),
]


def _pair(tmp_path, **kw):
    folder = make_checkpoint(tmp_path, **kw)
    ours = load_wide_model(folder).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ours, hf


def _prompt(batch=2, length=9, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("kw", ARCHS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_forced_dense_matches_transformers_prefill_and_decode(tmp_path, kw):
    ours, hf = _pair(tmp_path, **kw)
    ours.set_force_execute(True)
    ids, mask = _prompt()
    pos = positions(mask)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        logits, past = ours(ids, mask, pos, ours.empty_cache(2))
        real = mask.bool()
        torch.testing.assert_close(logits[real], ref.logits[real], rtol=1e-5, atol=2e-5)
        cache = ref.past_key_values
        for _ in range(3):  # decode steps with the KV cache
            nxt = logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            pos = pos[:, -1:] + 1
            ref = hf(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
            cache = ref.past_key_values
            logits, past = ours(nxt, mask, pos, past)
            torch.testing.assert_close(logits, ref.logits, rtol=1e-5, atol=2e-5)


def test_greedy_generation_matches_transformers_generate(tmp_path):
    ours, hf = _pair(tmp_path, arch="qwen2")
    ours.set_force_execute(True)
    ids, mask = _prompt(batch=2, length=6)
    new = greedy_generate(ours, ids, mask, max_new_tokens=6)
    ref = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                      pad_token_id=0, min_new_tokens=6)
    assert torch.equal(new, ref[:, ids.shape[1]:])


def test_kv_cache_decode_equals_full_forward(tmp_path):
    """Routing on: prefill+decode with the cache gives what one full pass gives."""
    model = load_wide_model(make_checkpoint(tmp_path, arch="llama")).model
    ids, mask = _prompt(length=8)
    with torch.no_grad():
        full, _ = model(ids, mask, positions(mask), model.empty_cache(2))
        head, past = model(ids[:, :5], mask[:, :5], positions(mask)[:, :5], model.empty_cache(2))
        tail = []
        for t in range(5, 8):
            step, past = model(ids[:, t:t + 1], mask[:, :t + 1], positions(mask)[:, t:t + 1], past)
            tail.append(step)
    real = mask.bool()  # padded positions attend to nothing: their logits are meaningless
    torch.testing.assert_close(torch.cat([head, *tail], 1)[real], full[real], rtol=1e-5, atol=1e-5)


def test_routing_changes_the_output_and_masks_are_collected(tmp_path):
    """Collected masks equal decisions made by hand from router.pth on the hidden states the layers see."""
    folder = make_checkpoint(tmp_path, arch="llama")
    model = load_wide_model(folder).model
    routers = read_routers(folder / "router.pth")  # parsed by the test's own code, not the loader
    seen: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):  # residual stream entering each sublayer's norm
        hooks.append(layer.input_layernorm.register_forward_pre_hook(
            lambda _m, args, i=i: seen.__setitem__((i, "attention"), args[0])))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(
            lambda _m, args, i=i: seen.__setitem__((i, "ffn"), args[0])))
    ids, mask = _prompt()
    collect = Collector()
    with torch.no_grad():
        routed, _ = model(ids, mask, positions(mask), model.empty_cache(2), collect)
        for h in hooks:
            h.remove()
        model.set_force_execute(True)
        dense, _ = model(ids, mask, positions(mask), model.empty_cache(2))
    assert (routed - dense).abs().max() > 1e-2
    assert len(collect.masks) == model.config.num_layers
    for i, (masks, margins) in enumerate(zip(collect.masks, collect.margins)):
        assert set(masks) == {"attention", "ffn"}
        for kind, m in masks.items():
            assert m.dtype == torch.int32 and m.shape[:2] == ids.shape
            want, want_margin = hand_route(seen[i, kind], routers[i, kind])
            assert want_margin.abs().min() > 1e-5  # no decision within rounding of a tie
            assert torch.equal(m.bool(), want), (i, kind)
            torch.testing.assert_close(margins[kind].double(), want_margin, rtol=1e-4, atol=1e-5)
            assert 0.1 < m.float().mean() < 0.9  # the random routers really skip groups
