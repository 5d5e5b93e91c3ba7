"""Attention that leaves out skipped heads (kernels/attention.py, the Triton kernels in triton_kernels.py) against the
PyTorch reference (ops/reference.masked_attention): decode with per-sequence lengths over a preallocated cache,
split over the sequence or not; prefill with a past and per-token head masks. Masks none / random / all-off /
all-on, GQA ratios 1..8, head sizes 64 / 128 (and 80, not a power of two), fp32 / fp16 / bf16, fresh random
inputs. On CPU the kernels run in Triton's interpreter; a skipped (token, head) must be exactly 0."""

from __future__ import annotations

import pytest
import torch

from wide_export.kernels.attention import decode_attention, plan_splits, prefill_attention
from wide_export.ops.reference import masked_attention

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _mask(kind: str, shape, gen):
    if kind == "none":
        return None
    if kind == "all-on":
        return torch.ones(shape, dtype=torch.int32)
    if kind == "all-off":
        return torch.zeros(shape, dtype=torch.int32)
    return (torch.rand(shape, generator=gen) < 0.5).to(torch.int32)


def _close(got, want, dtype):
    err = (got.float() - want.float()).abs().max().item()
    assert err <= TOL[dtype] * max(1.0, want.float().abs().max().item()), err


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "random", "all-off", "all-on"])
@pytest.mark.parametrize("B,Hq,Hk,D,gh,lengths,splits", [
    (2, 8, 2, 64, 2, (150, 37), None),      # GQA 4, two lengths, automatic splits
    (1, 16, 4, 128, 4, (300,), 3),          # Llama-like heads, three splits
    (3, 4, 4, 80, 1, (1, 64, 65), 1),       # no GQA, head size 80, a length of one, one tile + one
    (1, 8, 1, 64, 8, (129,), 2),            # GQA 8, one group of all heads
])
def test_decode_attention_matches_the_reference(dtype, kind, B, Hq, Hk, D, gh, lengths, splits):
    gen = torch.Generator().manual_seed(B * Hq * D + len(kind))
    cap = max(lengths) + 7  # a preallocated cache beyond every length
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, cap, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, cap, D, generator=gen).to(dtype)
    k[:, :, max(lengths):] = float("nan")  # past every length: must not be read
    v[:, :, max(lengths):] = float("nan")
    mask = _mask(kind, (B, Hq // gh), gen)
    lens = torch.tensor(lengths, dtype=torch.int32)
    got = decode_attention(q, k, v, mask, gh, lens, splits=splits)
    for b, L in enumerate(lengths):
        want = masked_attention(q[b:b + 1, :, None], k[b:b + 1, :, :L], v[b:b + 1, :, :L],
                                None if mask is None else mask[b:b + 1], gh)[:, :, 0]
        _close(got[b:b + 1], want, dtype)
        if mask is not None:
            off = ~mask[b].bool().repeat_interleave(gh)
            assert torch.equal(got[b, off], torch.zeros_like(got[b, off]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "random", "all-off", "all-on"])
@pytest.mark.parametrize("B,T,past,Hq,Hk,D,gh,block", [
    (2, 37, 5, 8, 2, 64, 2, 16),            # tails in queries and keys, a past
    (1, 40, 0, 16, 4, 128, 4, 16),          # no past, Llama-like heads
    (1, 9, 30, 4, 4, 80, 2, 16),            # no GQA, head size 80, a long past
    (2, 20, 3, 8, 1, 64, 8, 32),            # GQA 8
])
def test_prefill_attention_matches_the_reference(dtype, kind, B, T, past, Hq, Hk, D, gh, block):
    gen = torch.Generator().manual_seed(B * T * D + past + len(kind))
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, past + T, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, past + T, D, generator=gen).to(dtype)
    mask = _mask(kind, (B, T, Hq // gh), gen)
    got = prefill_attention(q, k, v, mask, gh, block_m=block, block_n=block)
    want = masked_attention(q.transpose(1, 2), k, v, mask, gh).transpose(1, 2)
    _close(got, want, dtype)
    if mask is not None:
        off = ~mask.bool().repeat_interleave(gh, dim=-1)  # [B, T, Hq]
        assert torch.equal(got[off], torch.zeros_like(got[off]))


def test_a_tile_with_no_token_keeping_a_head_is_zero_and_the_rest_exact():
    """Tokens 0..15 (one tile) skip every group, tokens 16.. keep all: the first tile is 0, the second the
    reference's (its keys include the first tile's tokens)."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 32, 4, 64, generator=gen)
    k = torch.randn(1, 2, 32, 64, generator=gen)
    v = torch.randn(1, 2, 32, 64, generator=gen)
    mask = torch.ones(1, 32, 2, dtype=torch.int32)
    mask[:, :16] = 0
    got = prefill_attention(q, k, v, mask, 2, block_m=16, block_n=16)
    assert torch.equal(got[:, :16], torch.zeros_like(got[:, :16]))
    _close(got[:, 16:], masked_attention(q.transpose(1, 2), k, v).transpose(1, 2)[:, 16:], torch.float32)


def test_split_plan_fills_the_gpu_and_covers_every_key():
    # 512 tiles of 64 keys; 264 programs / 8 KV heads = 33 splits wanted, of ceil(512 / 33) = 16 tiles: 32 needed
    assert plan_splits(1, 8, 32768) == (32, 16)
    assert plan_splits(64, 8, 4096) == (1, 64)  # enough programs already: one split
    assert plan_splits(1, 1, 10) == (1, 1)
    for b, h, L in ((1, 8, 4096), (16, 8, 4096), (1, 4, 100), (3, 2, 65)):
        splits, per = plan_splits(b, h, L)
        assert splits * per * 64 >= L > (splits - 1) * per * 64


def test_bad_shapes_are_refused_in_one_line():
    from wide_export.base.errors import WideError

    q, k = torch.randn(1, 6, 64), torch.randn(1, 4, 9, 64)
    with pytest.raises(WideError, match="do not match"):
        decode_attention(q, k, k)
    with pytest.raises(WideError, match="head_mask must be"):
        decode_attention(torch.randn(1, 4, 64), k, k, torch.ones(1, 3, dtype=torch.int32), 2)
    with pytest.raises(WideError, match="head_dim contiguous"):
        decode_attention(torch.randn(1, 4, 64), k.transpose(-1, -2).contiguous().transpose(-1, -2), k)
    with pytest.raises(WideError, match="past"):
        prefill_attention(torch.randn(1, 10, 4, 64), k, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_on_the_gpu_at_model_sizes(dtype):
    """The compiled kernels (gpu-check runs `-m gpu tests/kernels`): decode of 16 sequences over 4k-position
    caches (split over the sequence), and a 1k-token prefill after a 256-token past, Llama-3.1-8B heads (32 / 8
    of 128, 4 heads a group), half the groups skipped; four JIT specialisations a dtype."""
    gen = torch.Generator().manual_seed(7)
    B, Hq, Hk, D, gh, L = 16, 32, 8, 128, 4, 4096
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, Hk, L, D, generator=gen).to(dtype)
    v = torch.randn(B, Hk, L, D, generator=gen).to(dtype)
    mask = _mask("random", (B, Hq // gh), gen)
    lens = torch.randint(1, L + 1, (B,), generator=gen, dtype=torch.int32)
    got = decode_attention(q.cuda(), k.cuda(), v.cuda(), mask.cuda(), gh, lens.cuda()).cpu()
    for b in (0, 7, 15):
        n = int(lens[b])
        want = masked_attention(q[b:b + 1, :, None], k[b:b + 1, :, :n], v[b:b + 1, :, :n], mask[b:b + 1], gh)
        _close(got[b:b + 1], want[:, :, 0], dtype)
    T, past = 1024, 256
    q = torch.randn(1, T, Hq, D, generator=gen).to(dtype)
    k = torch.randn(1, Hk, past + T, D, generator=gen).to(dtype)
    v = torch.randn(1, Hk, past + T, D, generator=gen).to(dtype)
    mask = _mask("random", (1, T, Hq // gh), gen)
    got = prefill_attention(q.cuda(), k.cuda(), v.cuda(), mask.cuda(), gh).cpu()
    _close(got, masked_attention(q.transpose(1, 2), k, v, mask, gh).transpose(1, 2), dtype)
