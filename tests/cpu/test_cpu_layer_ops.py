"""The decode step's small ops in cpu/csrc/ops.cpp (RMSNorm, rotary embedding, the router, decode attention that
leaves out skipped heads) against the model's own reference code (model/modeling.py, ops/reference.py), on fresh
random inputs, every dtype, odd and model sizes, and every instruction-set path this CPU has."""

from __future__ import annotations

import pytest
import torch

from wide_export.model.modeling import RMSNorm, rotate_half
from wide_export.ops import reference as ref

cpu = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ISAS = ["avx512bf16", "avx512", "avx2", "scalar"]
BEST = torch.ops.wide_cpu.isa().split(" ")[0] if cpu.available() else "scalar"
PATHS_HERE = ISAS[ISAS.index(BEST):]


@pytest.fixture()
def isa(request):
    before = torch.ops.wide_cpu.set_isa(request.param)
    yield request.param
    torch.ops.wide_cpu.set_isa(before)


def _ulp(dtype) -> float:
    return {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]


@pytest.mark.parametrize("isa", PATHS_HERE, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,H", [(1, 17), (3, 33), (1, 2048), (5, 4096)])
def test_rms_norm_matches_the_models_reference(isa, dtype, M, H):
    gen = torch.Generator().manual_seed(M * H)
    norm = RMSNorm(H, 1e-5).to(dtype)
    norm.weight.data = (torch.rand(H, generator=gen) + 0.5).to(dtype)
    x = (torch.randn(M, H, generator=gen) * 3).to(dtype)
    got = cpu.rms_norm(x, norm.weight.data, norm.eps)
    if got is None:  # float16 without AVX-512: declined, the model runs its reference
        assert isa == "scalar" and dtype == torch.float16
        return
    want = norm(x)
    # the sum of squares in another order: at most one unit in the last place of the dtype apart
    torch.testing.assert_close(got, want, rtol=_ulp(dtype), atol=_ulp(dtype))


def _rope_reference(x, cos, sin):
    xt = x.transpose(1, 2)  # [B, H, T, D], as modeling.Attention rotates it
    return (xt * cos + rotate_half(xt) * sin).transpose(1, 2)


@pytest.mark.parametrize("isa", PATHS_HERE, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,Hq,Hk,D", [(1, 1, 16, 4, 128), (2, 3, 6, 2, 64), (1, 5, 3, 3, 40), (1, 1, 2, 1, 6)])
def test_rope_in_place_equals_the_models_reference_exactly(isa, dtype, B, T, Hq, Hk, D):
    """The same products and sums in the same dtype, rounded where the reference rounds: equal, not close."""
    gen = torch.Generator().manual_seed(B * T * D)
    q = torch.randn(B, T, Hq, D, generator=gen).to(dtype)
    k = torch.randn(B, T, Hk, D, generator=gen).to(dtype)
    ang = torch.rand(B, 1, T, D, generator=gen) * 6.3
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    want_q, want_k = _rope_reference(q, cos, sin), _rope_reference(k, cos, sin)
    q0, k0 = q.clone(), k.clone()
    if not cpu.rope_(q, k, cos, sin):
        assert isa == "scalar" and dtype == torch.float16
        assert torch.equal(q, q0) and torch.equal(k, k0)  # declined: nothing changed
        return
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


@pytest.mark.parametrize("isa", PATHS_HERE, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,H,R,G", [(1, 2048, 64, 8), (1, 2048, 64, 64), (3, 37, 5, 3), (16, 512, 32, 16)])
def test_router_matches_the_reference_off_ties(isa, dtype, M, H, R, G):
    gen = torch.Generator().manual_seed(M + H + R + G)
    h = torch.randn(M, H, generator=gen).to(dtype)
    wc, bc = torch.randn(R, H, generator=gen) / H**0.5, torch.randn(R, generator=gen)
    wr, br = torch.randn(2 * G, R, generator=gen) / R**0.5, torch.randn(2 * G, generator=gen)
    got = cpu.router(h, wc, bc, wr, br)
    logits = ref.router_logits(h, wc, bc, wr, br)
    margin = logits[..., 0] - logits[..., 1]
    want = ref.wide_router(h, wc, bc, wr, br)
    assert got.dtype == torch.int32 and got.shape == want.shape
    clear = margin.abs() > 1e-4 * logits.abs().amax()  # a float32 sum in another order may flip a near tie
    assert torch.equal(got[clear], want[clear])
    assert clear.float().mean() > 0.95


def _attention_reference(q, k, v):
    """modeling.Attention._attend's reference path for one query (repeat_kv, float32 softmax)."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)


def _head_mask(kind: str, B: int, G: int, gen) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "all-on":
        return torch.ones(B, 1, G, dtype=torch.int32)
    if kind == "all-off":
        return torch.zeros(B, 1, G, dtype=torch.int32)
    return (torch.rand(B, 1, G, generator=gen) < 0.5).to(torch.int32)


@pytest.mark.parametrize("isa", PATHS_HERE, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hq,Hk,D,L,gh", [(1, 16, 4, 128, 1, 2), (1, 16, 4, 128, 300, 2), (2, 8, 8, 64, 37, 1),
                                            (3, 32, 4, 128, 129, 4), (1, 6, 2, 72, 17, 3), (2, 4, 1, 80, 5, 4),
                                            (1, 4, 2, 36, 9, 2)])
@pytest.mark.parametrize("kind", ["none", "random", "all-on", "all-off"])
def test_decode_attention_matches_the_reference_and_skips_heads(isa, dtype, B, Hq, Hk, D, L, gh, kind):
    """One query per sequence over a preallocated cache's view (capacity beyond the length, as StaticKV holds
    it); GQA ratios 1..8, head sizes 36 / 64 / 72 / 80 / 128 (AVX2 takes multiples of 8), lengths 1..300; heads of
    skipped groups exactly 0."""
    gen = torch.Generator().manual_seed(B * Hq * D + L)
    q = torch.randn(B, Hq, 1, D, generator=gen).to(dtype)
    cache_k = torch.randn(B, Hk, L + 11, D, generator=gen).to(dtype)
    cache_v = torch.randn(B, Hk, L + 11, D, generator=gen).to(dtype)
    k, v = cache_k[:, :, :L], cache_v[:, :, :L]
    mask = _head_mask(kind, B, Hq // gh, gen)
    got = cpu.decode_attention(q, k, v, mask, gh)
    if got is None:
        assert isa == "scalar" or (isa == "avx2" and D % 8)  # declined: the model runs torch's attention
        return
    want = _attention_reference(q.float(), k.float(), v.float()).to(dtype)
    heads = torch.ones(B, Hq, dtype=torch.bool) if mask is None else \
        mask.reshape(B, -1).bool().repeat_interleave(gh, dim=1)
    assert torch.equal(got[~heads], torch.zeros_like(got[~heads]))
    tol = 2e-5 if dtype == torch.float32 else 2 * _ulp(dtype)
    torch.testing.assert_close(got[heads], want[heads], rtol=tol, atol=tol)


def test_decode_attention_declines_what_it_does_not_take():
    q = torch.randn(1, 4, 2, 64)  # two queries: a prefill, torch's attention
    k = torch.randn(1, 2, 9, 64)
    assert cpu.decode_attention(q, k, k) is None
    assert cpu.decode_attention(q[:, :, :1], k.transpose(-1, -2).contiguous().transpose(-1, -2), k) is None


def test_bad_shapes_are_refused_not_read_out_of_bounds():
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.wide_cpu.rms_norm(x, torch.ones(63), 1e-5, torch.empty_like(x))
    with pytest.raises(RuntimeError, match="cos and sin"):
        torch.ops.wide_cpu.rope(torch.randn(1, 2, 4, 64), torch.randn(1, 64), torch.randn(2, 64))
    with pytest.raises(RuntimeError, match="router's weights|wc"):
        torch.ops.wide_cpu.router(x, torch.randn(8, 63), torch.randn(8), torch.randn(4, 8), torch.randn(4),
                                  torch.empty(2, 2, dtype=torch.int32))
    q = torch.randn(1, 4, 64)
    with pytest.raises(RuntimeError, match=">= length"):
        torch.ops.wide_cpu.decode_attention(q, torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64), 6, None, 1,
                                            torch.empty_like(q))
    with pytest.raises(RuntimeError, match="head_mask"):
        torch.ops.wide_cpu.decode_attention(q, torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64), 5,
                                            torch.ones(1, 3, dtype=torch.int32), 2, torch.empty_like(q))
