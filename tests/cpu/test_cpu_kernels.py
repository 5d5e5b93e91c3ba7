"""The CPU kernels (wide_export/cpu, C++) against the PyTorch references of wide_export.ops.reference:
shapes with odd K and N, group sizes 3..512, Llama-3.1-8B and Qwen3 widths, sparsities 0 / 0.25 / 0.5 / 0.9 / 1,
float32, bfloat16 and float16, 1..64 tokens, fresh random inputs, outputs poisoned with NaN before the call; on
every instruction-set path this CPU has (AVX-512 BF16, AVX-512, AVX2, scalar)."""

from __future__ import annotations

import pytest
import torch

from wide_export.ops import reference as ref

cpu = pytest.importorskip("wide_export.cpu.ops")
pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")

# (N or K grouped width, group size, other dim): odd dims, tiny groups, model widths (8B: hidden 4096, FFN 14336,
# 32 heads x 128; Qwen3-8B: FFN 12288; Qwen3 q width 4096 with head_dim 128)
SHAPES = [(21, 3, 17), (15, 5, 33), (96, 32, 13), (256, 128, 48), (4096, 512, 96), (14336, 128, 24),
          (12288, 256, 32), (768, 256, 4096)]
SPARSITIES = [0.0, 0.25, 0.5, 0.9, 1.0]
TOKENS = [1, 2, 3, 16, 64]


def _mask(M: int, G: int, s: float, gen) -> torch.Tensor:
    keep = torch.rand(M, G, generator=gen) >= s
    if s == 0.0:
        keep[:] = True
    if s == 1.0:
        keep[:] = False
    return keep.to(torch.int32)


def _tol(dtype):
    return (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)


ISAS = ["avx512bf16", "avx512", "avx2", "scalar"]  # every path this CPU runs: the best on every case, the rest
BEST = torch.ops.wide_cpu.isa().split(" ")[0] if cpu.available() else "scalar"  # on a cross-section


def _cases():
    for isa in ISAS[ISAS.index(BEST):]:
        for i, (width, gs, other) in enumerate(SHAPES):
            for s in SPARSITIES if isa == BEST else (0.5, 1.0):
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    M = TOKENS[(i + int(s * 4)) % len(TOKENS)] if width * other < 2**22 else 1 + i % 3
                    yield pytest.param(width, gs, other, s, dtype, M, isa,
                                       id=f"{isa}-{width}x{other}-gs{gs}-s{s}-{str(dtype)[6:]}-M{M}")


@pytest.fixture()
def isa(request):
    """Run the test on one instruction-set path (wide_cpu::set_isa), then restore the best."""
    before = torch.ops.wide_cpu.set_isa(request.param)
    yield request.param
    torch.ops.wide_cpu.set_isa(before)


def _poisoned(M, N, dtype):
    return torch.full((M, N), float("nan"), dtype=dtype)


@pytest.mark.parametrize("width,gs,K,s,dtype,M,isa", list(_cases()), indirect=["isa"])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_n_matches_reference(width, gs, K, s, dtype, M, isa, bias):
    gen = torch.Generator().manual_seed(hash((width, gs, K, s, M)) % 2**31)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = (torch.randn(width, K, generator=gen) * 0.05).to(dtype)
    b = torch.randn(width, generator=gen).to(dtype) if bias else None
    mask = _mask(M, width // gs, s, gen)
    out = _poisoned(M, width, dtype)
    got = cpu.masked_gemm_n(x, w, mask, gs, bias=b, out=out, path="masked")
    assert got.data_ptr() == out.data_ptr()
    want = ref.masked_gemm_n(x, w, mask, gs, b)
    torch.testing.assert_close(got.float(), want.float(), rtol=_tol(dtype)[0], atol=_tol(dtype)[1])
    assert (got[ref.expand_mask(mask, gs, torch.bool) == 0] == 0).all()  # skipped outputs exactly 0


@pytest.mark.parametrize("width,gs,K,s,dtype,M,isa", list(_cases()), indirect=["isa"])
def test_gated_matches_reference(width, gs, K, s, dtype, M, isa):
    gen = torch.Generator().manual_seed(hash((width, gs, K, s, M, "g")) % 2**31)
    x = torch.randn(M, K, generator=gen).to(dtype)
    wg = (torch.randn(width, K, generator=gen) * 0.05).to(dtype)
    wu = (torch.randn(width, K, generator=gen) * 0.05).to(dtype)
    mask = _mask(M, width // gs, s, gen)
    got = cpu.masked_gated_mlp(x, wg, wu, mask, gs, out=_poisoned(M, width, dtype), path="masked")
    want = ref.masked_gated_mlp(x, wg, wu, mask, gs)
    torch.testing.assert_close(got.float(), want.float(), rtol=_tol(dtype)[0], atol=_tol(dtype)[1])
    assert (got[ref.expand_mask(mask, gs, torch.bool) == 0] == 0).all()


@pytest.mark.parametrize("isa", ISAS[ISAS.index(BEST):], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gs", [6, 7, 8])
@pytest.mark.parametrize("K", [37, 1061])
def test_every_tile_of_tokens_a_group_can_meet(isa, dtype, gs, K):
    """A group's rows meet 1..17 tokens in one call (the kernel's tiles: 4 rows x 1-4 tokens, pairs x 5-8,
    pairs x 9-16 in two passes over k in chunks of 512, then a second call), in full row blocks and in a
    group's last partial block (gs 6, 7), over an odd K (the masked tail; 1061: two whole chunks and a tail);
    group g is executed by exactly the first g + 1 tokens."""
    M, G = 17, 17
    gen = torch.Generator().manual_seed(gs)
    x = torch.randn(M, K, generator=gen).to(dtype)
    wg = (torch.randn(G * gs, K, generator=gen) * 0.05).to(dtype)
    wu = (torch.randn(G * gs, K, generator=gen) * 0.05).to(dtype)
    mask = (torch.arange(M)[:, None] <= torch.arange(G)[None, :]).to(torch.int32)
    got = cpu.masked_gemm_n(x, wg, mask, gs, out=_poisoned(M, G * gs, dtype), path="masked")
    torch.testing.assert_close(got.float(), ref.masked_gemm_n(x, wg, mask, gs).float(), rtol=_tol(dtype)[0],
                               atol=_tol(dtype)[1])
    got = cpu.masked_gated_mlp(x, wg, wu, mask, gs, out=_poisoned(M, G * gs, dtype), path="masked")
    torch.testing.assert_close(got.float(), ref.masked_gated_mlp(x, wg, wu, mask, gs).float(),
                               rtol=_tol(dtype)[0], atol=_tol(dtype)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M,bias", [(1, False), (3, True), (9, False)])
def test_dense_linear_through_the_kernel_matches_torch(monkeypatch, dtype, M, bias):
    """k / v / the LM head on the fast path: the kernel with one group of all N rows (forced here; the policy
    decides in use), against torch's own F.linear."""
    monkeypatch.setattr(cpu, "choose", lambda *_a: "masked")
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(2, M, 67, generator=gen).to(dtype)
    w = (torch.randn(36, 67, generator=gen) * 0.05).to(dtype)
    b = torch.randn(36, generator=gen).to(dtype) if bias else None
    cpu.PATHS.clear()
    got = cpu.dense_linear(x, w, b)
    assert cpu.PATHS["linear", "masked"] == 1 and got.shape == (2, M, 36)
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(got.float(), want, rtol=_tol(dtype)[0], atol=_tol(dtype)[1])


def test_dense_linear_follows_the_policy_at_a_full_union():
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    for dtype in ("float32", "bfloat16", "float16"):
        cpu.PATHS.clear()
        cpu.dense_linear(x.to(getattr(torch, dtype)), w.to(getattr(torch, dtype)))
        want = cpu.choose("n", 1, dtype, lambda: 1.0) == "masked"
        assert cpu.PATHS["linear", "masked"] == int(want), dtype


@pytest.mark.parametrize("width,gs,N,s,dtype,M,isa", list(_cases()), indirect=["isa"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", ["nk", "packed", "kt"])
def test_gemm_k_matches_reference(width, gs, N, s, dtype, M, isa, bias, layout):
    """K-pruned: `width` is K here (o_proj / down_proj input); w as [N, K], packed [G, N, gs] (pack_k) or
    transposed [K, N] (masked_gemm_kt)."""
    packed = layout == "packed"
    gen = torch.Generator().manual_seed(hash((width, gs, N, s, M, "k")) % 2**31)
    x = torch.randn(M, width, generator=gen).to(dtype)
    w = (torch.randn(N, width, generator=gen) * 0.05).to(dtype)
    b = torch.randn(N, generator=gen).to(dtype) if bias else None
    mask = _mask(M, width // gs, s, gen)
    if packed and N % 16:
        with pytest.raises(ValueError, match="pack_k needs"):
            cpu.pack_k(w, gs)
        return
    wk = cpu.pack_k(w, gs) if packed else w
    assert not packed or wk.shape == (width // gs, N // 16, gs, 16)
    if layout == "kt":
        got = cpu.masked_gemm_kt(x, w.t().contiguous(), mask, gs, bias=b, out=_poisoned(M, N, dtype), path="masked")
    else:
        got = cpu.masked_gemm_k(x, wk, mask, gs, bias=b, out=_poisoned(M, N, dtype), path="masked")
    want = ref.masked_gemm_k(x, w, mask, gs, b)
    tol = _tol(dtype)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1] * max(1.0, (width / 512) ** 0.5))


@pytest.mark.parametrize("isa", ISAS[ISAS.index(BEST):], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,threads", [(16 * 37, 1), (16 * 37, 2), (16 * 8, 2), (16 * 4, 1)])
@pytest.mark.parametrize("M", [1, 6])
def test_packed_decode_streams_match_the_reference(isa, dtype, N, threads, M):
    """A packed weight: each thread's range in four streams (ranges of 4+ blocks, uneven), the remainder one by
    one; one token, or up to six (AVX-512: four tokens a pass of the four streams, then the rest, one token
    included)."""
    gen = torch.Generator().manual_seed(N + threads + M)
    x, w = torch.randn(M, 384, generator=gen).to(dtype), (torch.randn(N, 384, generator=gen) * 0.05).to(dtype)
    b, mask = torch.randn(N, generator=gen).to(dtype), _mask(M, 12, 0.3, gen)
    mask[:, 0] = 1  # group 0: all six tokens (a pass of four, then two); the others about 70 % of them
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = cpu.masked_gemm_k(x, cpu.pack_k(w, 32), mask, 32, bias=b, out=_poisoned(M, N, dtype), path="masked")
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got.float(), ref.masked_gemm_k(x, w, mask, 32, b).float(), rtol=_tol(dtype)[0],
                               atol=_tol(dtype)[1])


@pytest.mark.parametrize("isa", ISAS[ISAS.index(BEST):], indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("groups,threads,M", [(12, 1, 1), (12, 2, 1), (1, 2, 1), (3, 2, 9), (5, 3, 20)])
def test_transposed_weight_split_over_threads_matches_the_reference(isa, dtype, groups, threads, M):
    """wt = W^T: threads split the executed groups (fewer groups than threads too) into partial sums summed
    at the end; more tokens than a pass takes (16) and N-tiles (N = 2000: tiles of 448 floats at 9 tokens, of
    256 at 16; 32 columns a step and a 16-column tail)."""
    gen = torch.Generator().manual_seed(groups * 10 + threads + M)
    N, gs = 2000 if M > 8 else 144, 32
    x = torch.randn(M, groups * gs, generator=gen).to(dtype)
    w = (torch.randn(N, groups * gs, generator=gen) * 0.05).to(dtype)
    b, mask = torch.randn(N, generator=gen).to(dtype), _mask(M, groups, 0.4, gen)
    mask[0, 0] = 1
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        got = cpu.masked_gemm_kt(x, w.t().contiguous(), mask, gs, bias=b, out=_poisoned(M, N, dtype), path="masked")
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(got.float(), ref.masked_gemm_k(x, w, mask, gs, b).float(), rtol=_tol(dtype)[0],
                               atol=_tol(dtype)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_dense_path_of_a_transposed_weight_reads_it_as_it_is(dtype):
    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn(7, 96, generator=gen).to(dtype), (torch.randn(48, 96, generator=gen) * 0.1).to(dtype)
    b, mask = torch.randn(48, generator=gen).to(dtype), _mask(7, 3, 0.5, gen)
    want = ref.masked_gemm_k(x, w, mask, 32, b).float()
    for path in ("dense", "masked"):
        got = cpu.masked_gemm_kt(x, w.t().contiguous(), mask, 32, bias=b, path=path)
        torch.testing.assert_close(got.float(), want, rtol=_tol(dtype)[0], atol=_tol(dtype)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_dense_path_of_a_packed_weight_matches_the_reference(dtype):
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 96, generator=gen).to(dtype), (torch.randn(48, 96, generator=gen) * 0.1).to(dtype)
    b, mask = torch.randn(48, generator=gen).to(dtype), _mask(7, 3, 0.5, gen)
    want = ref.masked_gemm_k(x, w, mask, 32, b).float()
    wp = cpu.pack_k(w, 32)
    assert torch.equal(cpu.unpack_k(wp), w)
    for args in ({"w": wp}, {"w": w, "packed": wp}):  # packed alone (slabs per call), or kept beside w
        for path in ("dense", "masked"):
            got = cpu.masked_gemm_k(x, mask=mask, group_size=32, bias=b, path=path, **args)
            torch.testing.assert_close(got.float(), want, rtol=_tol(dtype)[0], atol=_tol(dtype)[1])


def test_leading_dims_and_the_dense_path_agree():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 64, generator=gen)
    w = torch.randn(96, 64, generator=gen)
    mask = _mask(6, 3, 0.5, gen).reshape(2, 3, 3)
    a = cpu.masked_gemm_n(x, w, mask, 32, path="masked")
    b = cpu.masked_gemm_n(x, w, mask, 32, path="dense")
    assert a.shape == (2, 3, 96)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    x_before, wk = x.clone(), torch.randn(40, 64, generator=gen)
    mk = _mask(6, 2, 0.5, gen).reshape(2, 3, 2)
    for path in ("dense", "masked"):  # the K-pruned paths zero skipped inputs in a copy, never in x
        got = cpu.masked_gemm_k(x, wk, mk, 32, path=path)
        torch.testing.assert_close(got, ref.masked_gemm_k(x, wk, mk, 32), rtol=1e-4, atol=1e-4)
        assert torch.equal(x, x_before)


def test_bad_shapes_are_refused_not_read_out_of_bounds():
    x, w = torch.randn(2, 64), torch.randn(96, 64)
    with pytest.raises(RuntimeError, match="G \\* group_size = N"):
        cpu.masked_gemm_n(x, w, torch.ones(2, 4, dtype=torch.int32), 32, path="masked")
    with pytest.raises(RuntimeError, match="share a dtype"):
        cpu.masked_gemm_n(x, w.to(torch.bfloat16), torch.ones(2, 3, dtype=torch.int32), 32, path="masked")


def test_one_and_two_threads_give_the_same_exact_result():
    """Threads from torch's intra-op pool (torch.set_num_threads): each output block is computed whole by one
    thread, in the same order, so the result does not depend on the thread count, and matches the reference."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 256, generator=gen), torch.randn(512, 256, generator=gen)
    mask = _mask(3, 2, 0.5, gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu.masked_gemm_k(x, w, mask, 128, path="masked")
        torch.set_num_threads(2)
        two = cpu.masked_gemm_k(x, w, mask, 128, path="masked")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    torch.testing.assert_close(one, ref.masked_gemm_k(x, w, mask, 128), rtol=1e-4, atol=1e-4)


def test_compiled_graphs_keep_the_ops_whole():
    """torch.compile sees wide_cpu::* through their fake implementations (no graph break, same result)."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(1, 128, generator=gen), torch.randn(256, 128, generator=gen)
    mask = _mask(1, 4, 0.5, gen)

    def f(x, w, mask):
        out = x.new_empty(1, 256)
        torch.ops.wide_cpu.gemm_n(x, w, mask, 64, None, out)
        return out * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, w, mask), 2 * ref.masked_gemm_n(x, w, mask, 64), rtol=1e-4, atol=1e-4)


def test_generation_with_the_cpu_kernels_gives_the_reference_tokens(tmp_path):
    """model.use_method(CpuKernelsMethod()): the model's eager calls run wide_export.cpu; float32 greedy tokens
    equal the reference's, and the masked kernels did serve the decode steps."""
    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import load_wide_model
    from wide_export.generation.torch_step import greedy_generate
    from wide_export.model.methods import CpuKernelsMethod

    model = load_wide_model(make_checkpoint(tmp_path / "ck", num_layers=2, seed=3)).model.eval()
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = greedy_generate(model, ids, torch.ones_like(ids), 6)
        cpu.PATHS.clear()
        model.use_method(CpuKernelsMethod())
        got = greedy_generate(model, ids, torch.ones_like(ids), 6)
    # o_proj / down_proj laid out as W^T by the method: the K-pruned kernel reads that (kt)
    assert cpu.PATHS["gated", "masked"] > 0 and cpu.PATHS["kt", "masked"] > 0, cpu.PATHS
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_model_logits_with_the_cpu_kernels_match_the_reference(tmp_path, dtype):
    """bf16 / f16: the kernels round once at the output as the reference does, but sum in another order, so a
    random model's near-tied argmax may flip; the logits agree to half precision."""
    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import load_wide_model
    from wide_export.model.methods import CpuKernelsMethod

    model = load_wide_model(make_checkpoint(tmp_path / "ck", num_layers=2, seed=3), dtype=dtype).model.eval()
    ids = torch.randint(3, 200, (1, 1), generator=torch.Generator().manual_seed(0))
    mask, pos = torch.ones_like(ids), torch.zeros_like(ids)
    with torch.no_grad():
        want = model(ids, mask, pos, model.empty_cache(1))[0].float()
        cpu.PATHS.clear()
        model.use_method(CpuKernelsMethod())
        got = model(ids, mask, pos, model.empty_cache(1))[0].float()
    assert cpu.PATHS["n", "masked"] > 0, cpu.PATHS
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
