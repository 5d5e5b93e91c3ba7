"""bench/routers.py: synthetic routers shifted to a stated sparsity, checked on tokens the calibration did not
see, through the reference model's own masks (not the margins the calibration reads)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import make_checkpoint


def _skipped(ckpt, seed: int) -> dict[str, list[torch.Tensor]]:
    from wide_export.checkpoint import load_wide_model
    from wide_export.model.modeling import Collector

    model = load_wide_model(ckpt, checksums=False).model
    ids = torch.randint(3, model.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(seed))
    collect = Collector()
    with torch.no_grad():
        model(ids, torch.ones_like(ids), torch.arange(64)[None].expand(8, 64), model.empty_cache(8), collect=collect)
    out: dict[str, list[torch.Tensor]] = {}
    for layer in collect.masks:
        for kind, mask in layer.items():
            out.setdefault(kind, []).append(1 - mask.flatten(0, 1).float())  # [B * T, G]: 1 where skipped
    return out


@pytest.mark.parametrize("sparsity", [0.0, 0.25, 0.5, 0.75])
def test_calibrated_routers_skip_the_stated_fraction_per_group_on_fresh_tokens(tmp_path, sparsity):
    from wide_export.bench.routers import calibrate

    ckpt = make_checkpoint(tmp_path / "ckpt", num_layers=3, seed=11)
    before = torch.load(ckpt / "router.pth", weights_only=True)
    measured = calibrate(ckpt, sparsity)
    after = torch.load(ckpt / "router.pth", weights_only=True)
    assert set(after) == set(before)
    assert all(torch.equal(after[k], before[k]) for k in before if not k.endswith(".router.bias"))
    skipped = _skipped(ckpt, seed=99)
    assert set(skipped) == {"attention", "ffn"}
    for kind, layers in skipped.items():
        for per_token in layers:
            if sparsity == 0:
                assert per_token.sum() == 0
                continue
            assert abs(float(per_token.mean()) - sparsity) < 0.06, (kind, float(per_token.mean()))
            assert (per_token.mean(0) - sparsity).abs().max() < 0.15  # every group, not only on average
            assert 0 < float(per_token.mean(1).std())  # decisions differ between tokens
        assert abs(measured[kind] - sparsity) < 0.06
