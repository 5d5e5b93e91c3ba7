"""verify/reference.py: the reference's steps against independent paths (greedy_generate's tokens, a
cache-free forward over the whole sequence), the feeds' shapes and dtypes, and the streamed weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wide_export.verify import reference as refmod
from wide_export.verify.reference import left_padded_prompts, reference_steps, streamed


@pytest.fixture(scope="module")
def model(tiny_ckpt):
    from wide_export.checkpoint import load_wide_model

    return load_wide_model(tiny_ckpt, dtype="float32", checksums=False).model


def test_prompts_pad_only_the_first_row_by_a_third():
    ids, mask = left_padded_prompts(50, 3, 7, seed=1)
    assert ids.shape == mask.shape == (3, 7) and ids.dtype == mask.dtype == torch.long
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1] * 7, [1] * 7]
    assert int(ids.min()) >= 0 and int(ids.max()) < 50
    assert torch.equal(left_padded_prompts(50, 3, 7, seed=1)[0], ids)  # seeded
    assert not torch.equal(left_padded_prompts(50, 3, 7, seed=2)[0], ids)
    assert left_padded_prompts(50, 2, 2, seed=0)[1].tolist() == [[0, 1], [1, 1]]  # at least one pad
    assert left_padded_prompts(50, 1, 6, seed=0)[1].tolist() == [[1] * 6]  # one row: no padding


def test_steps_are_greedy_decoding_with_the_cache(model):
    from wide_export.generation.decoding import positions
    from wide_export.generation.torch_step import greedy_generate

    cfg = model.config
    steps = reference_steps(model, batch=2, prompt_len=5, steps=3, seed=0, kv_dtype="float32")
    assert len(steps) == 4
    ids, mask = left_padded_prompts(cfg.vocab_size, 2, 5, 0)
    assert np.array_equal(steps[0].feed["input_ids"], ids.numpy())
    assert np.array_equal(steps[0].feed["attention_mask"], mask.numpy())
    assert steps[0].feed["position_ids"].tolist() == [[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    tokens = greedy_generate(model, ids, mask, max_new_tokens=3)  # another implementation of the loop
    full_ids, full_mask = ids, mask
    for k in range(1, 4):
        feed = steps[k].feed
        assert feed["input_ids"].tolist() == tokens[:, k - 1: k].tolist()
        assert feed["attention_mask"].tolist() == [[0] + [1] * (4 + k), [1] * (5 + k)]
        assert feed["position_ids"].tolist() == [[3 + k], [4 + k]]
        assert not any(n.startswith("past_key_values.") for n in feed)  # the graph feeds its own presents
        full_ids = torch.cat([full_ids, torch.as_tensor(feed["input_ids"])], 1)
        full_mask = torch.cat([full_mask, torch.ones(2, 1, dtype=torch.long)], 1)
    # the last step's logits are those of one cache-free forward over the whole sequence
    with torch.no_grad():
        logits, _ = model(full_ids, full_mask, positions(full_mask), model.empty_cache(2))
    np.testing.assert_allclose(steps[3].ref["logits"][:, -1], logits[:, -1].numpy(), atol=1e-4)
    # and the prefill's, on real tokens (row 0's pad attends to nothing: its logits mean nothing)
    np.testing.assert_allclose(steps[0].ref["logits"][0, 1:], logits[0, 1:5].numpy(), atol=1e-4)
    np.testing.assert_allclose(steps[0].ref["logits"][1], logits[1, :5].numpy(), atol=1e-4)


@pytest.mark.parametrize("kv_dtype, np_dtype", [("float32", np.float32), ("float16", np.float16),
                                                 ("bfloat16", "bfloat16")])
def test_step_contents_shapes_and_dtypes(model, kv_dtype, np_dtype):
    from wide_export.ops.io_spec import mask_output_name

    cfg = model.config
    steps = reference_steps(model, batch=2, prompt_len=4, steps=1, seed=3, kv_dtype=kv_dtype)
    import ml_dtypes

    want = np.dtype(ml_dtypes.bfloat16) if np_dtype == "bfloat16" else np.dtype(np_dtype)
    for i in range(cfg.num_layers):
        for kv in ("key", "value"):
            empty = steps[0].feed[f"past_key_values.{i}.{kv}"]
            assert empty.shape == (2, cfg.num_key_value_heads, 0, cfg.head_dim)
            assert empty.dtype == want
            for k, step in enumerate(steps):
                present = step.ref[f"present.{i}.{kv}"]
                assert present.dtype == np.float32  # the reference's presents are float32
                assert present.shape == (2, cfg.num_key_value_heads, 4 + k, cfg.head_dim)
    for k, step in enumerate(steps):
        t = 4 if k == 0 else 1
        assert step.ref["logits"].shape == (2, t, cfg.vocab_size) and step.ref["logits"].dtype == np.float32
        masks = sorted(n for n in step.ref if n.startswith("/"))
        assert masks == sorted(mask_output_name(i, kind) for i in range(cfg.num_layers)
                               for kind in ("attention", "ffn"))
        for name in masks:
            assert step.ref[name].dtype == np.int32 and set(np.unique(step.ref[name])) <= {0, 1}
            assert step.margins[name].shape == step.ref[name].shape
        # the residual stream entering each layer, then the final norm
        assert len(step.hidden) == cfg.num_layers + 1
        assert all(h.shape == (2, t, cfg.hidden_size) and h.dtype == np.float32 for h in step.hidden)
    with torch.no_grad():
        embedded = model.model.embed_tokens(torch.as_tensor(steps[1].feed["input_ids"])).numpy()
    assert np.array_equal(steps[1].hidden[0], embedded)
    # the hooks are gone afterwards
    assert all(not m._forward_pre_hooks for m in [*model.model.layers, model.model.norm])


def test_margins_decide_the_masks(model):
    """A router executes a group where its logit margin is positive (mask 1) -- the margin is signed."""
    steps = reference_steps(model, batch=1, prompt_len=6, steps=0, seed=0, kv_dtype="float32")
    for name, margin in steps[0].margins.items():
        decided = steps[0].ref[name]
        assert np.array_equal(decided == 1, margin > 0) or np.array_equal(decided == 1, margin >= 0), name


# -- streamed weights
class _Weights:
    def __init__(self):
        self.read = []

    def tensor(self, name):
        self.read.append(name)
        shape = {"embed.weight": (5, 3), "lin.weight": (3, 3), "lin.bias": (3,), "head.weight": (2, 3)}
        return torch.full(shape[".".join(name.split(".")[-2:])], float(len(self.read)), dtype=torch.float16)


class _Tiny(torch.nn.Module):
    """model.embed_tokens / model.layers / model.norm / lm_head with placeholder parameters."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens.embed = torch.nn.Embedding(5, 3)
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].lin = torch.nn.Linear(3, 3)
        self.model.norm = torch.nn.Identity()
        self.lm_head = torch.nn.Module()
        self.lm_head.head = torch.nn.Linear(3, 2, bias=False)
        for mod, fwd in ((self.model.embed_tokens, lambda x: self.model.embed_tokens.embed(x)),
                         (self.model.layers[0], lambda h: self.model.layers[0].lin(h)),
                         (self.lm_head, lambda h: self.lm_head.head(h))):
            mod.forward = fwd

    def forward(self, ids):
        return self.lm_head(self.model.norm(self.model.layers[0](self.model.embed_tokens(ids))))


class _Loaded:
    def __init__(self):
        self.model, self.weights = _Tiny(), _Weights()


def test_streamed_model_reads_each_modules_weights_for_its_forward_only():
    loaded = _Loaded()
    placeholders = {n: p for n, p in loaded.model.named_parameters()}
    model = streamed(loaded)
    assert model is loaded.model
    out = model(torch.tensor([[1, 2]]))
    w = loaded.weights
    assert w.read == ["model.embed_tokens.embed.weight", "model.layers.0.lin.weight", "model.layers.0.lin.bias",
                      "lm_head.head.weight"]
    # by hand: embedding 1s, lin weight 2s + bias 3s -> each of 3 features 2*3 + 3 = 9, head 4s -> 4*3*9
    assert out.dtype == torch.float32
    assert out.tolist() == [[[108.0, 108.0], [108.0, 108.0]]]
    after = {n: p for n, p in loaded.model.named_parameters()}
    assert all(after[n] is placeholders[n] for n in placeholders)  # placeholders back
    model(torch.tensor([[0]]))
    assert len(w.read) == 8  # read again on every forward


def test_owner_finds_the_module_holding_a_parameter():
    tiny = _Tiny()
    assert refmod._owner(tiny.model.layers[0], "lin.weight") == (tiny.model.layers[0].lin, "weight")
    assert refmod._owner(tiny.model.norm, "weight") == (tiny.model.norm, "weight")
