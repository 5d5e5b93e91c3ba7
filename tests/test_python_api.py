"""The Python API refuses misuse instead of computing something else: the reference model
(wide_export/model/modeling.py) fed a past cache that does not have one entry per layer."""

from __future__ import annotations

import pytest
import torch

from wide_export.checkpoint import load_wide_model
from wide_export.errors import WideError


@pytest.fixture(scope="module")
def model():
    return load_wide_model(None, dtype="float32").model


def _inputs(model, batch=2, new=3):
    ids = torch.randint(0, model.config.vocab_size, (batch, new), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones(batch, new, dtype=torch.long), torch.arange(new).expand(batch, new)


@pytest.mark.parametrize("extra", [None, -1, +1])
def test_past_of_the_wrong_length_is_an_error(model, extra):
    n = model.config.num_layers
    past = [] if extra is None else model.empty_cache(2)[: n + extra] if extra < 0 else model.empty_cache(2) * 2
    with pytest.raises(WideError, match=f"past_key_values has {len(past)} entries for a model with {n} layers"):
        model(*_inputs(model), past)


def test_empty_cache_runs_every_layer(model):
    with torch.no_grad():
        logits, presents = model(*_inputs(model), model.empty_cache(2))
    c = model.config
    assert logits.shape == (2, 3, c.vocab_size) and torch.isfinite(logits).all()
    assert len(presents) == c.num_layers  # one present per layer, each holding the 3 new positions
    assert all(k.shape == (2, c.num_key_value_heads, 3, c.head_dim) for k, _ in presents)
