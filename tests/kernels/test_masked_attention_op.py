"""The WideMaskedAttention kernel (kernels/attention.masked_attention_op, sources.wide_masked_attention_kernel:
what the TensorRT plugin launches) against the op's PyTorch reference (ops/reference.wide_masked_attention, the
model's own attention): the model's `allowed` mask (causal and left padding, so rows allowed no key at all),
a past (decode and chunked prefill), head masks none / random / all-off / all-on, GQA 1..8, head sizes 64 /
128 / 80, fp32 / fp16 / bf16, fresh random inputs; and a non-causal random `allowed` with the causal
shortcut off. In Triton's interpreter on CPU. A skipped (token, head) must be exactly 0."""

from __future__ import annotations

import pytest
import torch

from wide_export.base.errors import WideError
from wide_export.kernels.attention import masked_attention_op
from wide_export.ops.reference import attention, wide_masked_attention

from .test_attention import DTYPES, _close
from .test_attention import _mask as _head_mask


def _allowed(B: int, T: int, S: int, pads) -> torch.Tensor:
    """The model's mask (model/modeling.py): causal (query t at position S - T + t) and not a left pad."""
    causal = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]
    keys = torch.ones(B, S, dtype=torch.bool)
    for b, pad in enumerate(pads):
        keys[b, :pad] = False
    return causal[None, None] & keys[:, None, None, :]


def _want(q, k, v, allowed, mask, gh):
    return attention(q, k, v, allowed) if mask is None else wide_masked_attention(q, k, v, allowed, mask, gh)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "random", "all-off", "all-on"])
@pytest.mark.parametrize("B,T,S,Hq,Hk,D,gh,pads,block", [
    (2, 37, 37, 8, 2, 64, 2, (0, 21), 16),     # prefill, one row left-padded past a whole tile
    (2, 1, 150, 8, 2, 64, 4, (3, 0), 64),      # decode over a past, one padded row
    (1, 20, 60, 16, 4, 128, 4, (0,), 16),      # chunked prefill over a past, Llama-like heads
    (3, 9, 9, 4, 4, 80, 1, (0, 4, 8), 16),     # no GQA, head size 80, a row of one real token
    (1, 33, 33, 8, 1, 64, 8, (17,), 16),       # GQA 8, 17 padding queries allowed no key
])
def test_the_kernel_matches_the_ops_reference(dtype, kind, B, T, S, Hq, Hk, D, gh, pads, block):
    gen = torch.Generator().manual_seed(B * T * S + D + len(kind))
    q = torch.randn(B, Hq, T, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    allowed = _allowed(B, T, S, pads)
    mask = _head_mask(kind, (B, T, Hq // gh), gen)
    want = _want(q, k, v, allowed, mask, gh)
    for causal in (True, False):
        got = masked_attention_op(q, k, v, allowed, mask, gh, causal=causal, block_m=block, block_n=block)
        _close(got, want, dtype)
        if mask is not None:
            off = ~mask.bool().repeat_interleave(gh, dim=-1).transpose(1, 2)  # [B, Hq, T]
            assert torch.equal(got[off], torch.zeros_like(got[off]))


def test_a_row_allowed_no_key_is_the_mean_of_every_value():
    """Left padding: the model's attention gives a query allowed no key the uniform average over all S keys
    (the float32 floor everywhere); the kernel's causal shortcut still averages the keys after its tile."""
    gen = torch.Generator().manual_seed(3)
    B, H, T, D = 1, 2, 40, 64
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    allowed = _allowed(B, T, T, (20,))
    got = masked_attention_op(q, k, v, allowed, None, 1, causal=True, block_m=16, block_n=16)
    mean = v.mean(dim=2, keepdim=True).expand(B, H, 20, D)
    torch.testing.assert_close(got[:, :, :20], mean, rtol=1e-5, atol=1e-5)
    _close(got, attention(q, k, v, allowed), torch.float32)


@pytest.mark.parametrize("splits", [1, 3, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_splits_the_keys_and_keeps_a_row_allowed_nothing(dtype, splits):
    """One query (the decode kernel, split over the keys, partials combined in split order): a row padded over
    every key (its query allowed nothing: the mean of every value, across splits), one padded past a whole
    split, one unpadded; GQA 4, a random head mask."""
    gen = torch.Generator().manual_seed(17 + splits)
    B, Hq, Hk, S, D, gh = 3, 8, 2, 300, 64, 2
    q = torch.randn(B, Hq, 1, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    allowed = _allowed(B, 1, S, (S, 130, 0))
    mask = _head_mask("random", (B, 1, Hq // gh), gen)
    got = masked_attention_op(q, k, v, allowed, mask, gh, splits=splits)
    _close(got, wide_masked_attention(q, k, v, allowed, mask, gh), dtype)
    keep = mask[0, 0].bool().repeat_interleave(gh)
    mean = v[0].float().mean(dim=1).repeat_interleave(Hq // Hk, dim=0)  # [Hq, D]: every value, weight 1
    _close(got[0, keep, 0], mean[keep], dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16))
def test_any_allowed_mask_without_the_causal_shortcut(dtype):
    """Not causal: random allowed entries (rows with none among them), keys after a query included."""
    gen = torch.Generator().manual_seed(11)
    B, Hq, Hk, T, S, D, gh = 2, 4, 2, 19, 45, 64, 2
    q = torch.randn(B, Hq, T, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
    allowed = torch.rand(B, 1, T, S, generator=gen) < 0.3
    allowed[0, 0, 5] = False
    mask = _head_mask("random", (B, T, Hq // gh), gen)
    got = masked_attention_op(q, k, v, allowed, mask, gh, causal=False, block_m=16, block_n=16)
    _close(got, wide_masked_attention(q, k, v, allowed, mask, gh), dtype)


def test_bad_shapes_are_refused_in_one_line():
    q = torch.zeros(1, 4, 3, 64)
    k = torch.zeros(1, 2, 5, 64)
    with pytest.raises(WideError, match="do not match"):
        masked_attention_op(q, k, k, torch.ones(1, 1, 3, 4, dtype=torch.bool), None, 1)
    with pytest.raises(WideError, match="head_mask must be"):
        masked_attention_op(q, k, k, torch.ones(1, 1, 3, 5, dtype=torch.bool), torch.ones(1, 3, 3), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_plugins_kernel_on_the_gpu_at_model_sizes(dtype):
    """Compiled (gpu-check runs `-m gpu tests/kernels`): a 512-token prefill of two rows, one left-padded by 100,
    and a decode step of 8 rows over 2k keys, Llama-3.1-8B heads (32 / 8 of 128, 4 a group), half skipped."""
    gen = torch.Generator().manual_seed(9)
    Hq, Hk, D, gh = 32, 8, 128, 4
    for B, T, S, pads in ((2, 512, 512, (100, 0)), (8, 1, 2048, (5,) + (0,) * 7)):
        q = torch.randn(B, Hq, T, D, generator=gen).to(dtype)
        k = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
        v = torch.randn(B, Hk, S, D, generator=gen).to(dtype)
        allowed = _allowed(B, T, S, pads)
        mask = _head_mask("random", (B, T, Hq // gh), gen)
        got = masked_attention_op(q.cuda(), k.cuda(), v.cuda(), allowed.cuda(), mask.cuda(), gh).cpu()
        _close(got, wide_masked_attention(q, k, v, allowed, mask, gh), dtype)
