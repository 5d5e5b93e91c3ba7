"""Every CUDA kernel against its PyTorch reference (needs a GPU: marker `gpu`).

Grid from the issue: T in {1, 2, 7, 16, 128, 1000, 4096}, G in {1, 32, 128},
sparsity {0, 0.5, 0.9, 1.0}, fp16 and bf16; plus odd shapes, float32,
strided rows, forced algorithms and a shared precomputed layout. Inputs are
fresh random tensors, outputs are poisoned with NaN before each call, and
masked-off inputs of the K-pruned op are filled with large garbage.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from wide_export.ops import reference as ref

pytestmark = pytest.mark.gpu

TOKENS = (1, 2, 7, 16, 128, 1000, 4096)
GROUPS = (1, 32, 128)
SPARSITY = (0.0, 0.5, 0.9, 1.0)
DTYPES = (torch.float16, torch.bfloat16)
# max |y - ref| / max |ref| per dtype (fp32 accumulation everywhere; this is output rounding + order)
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}
GRID = list(itertools.product(TOKENS, GROUPS, SPARSITY, DTYPES))
GRID_IDS = [f"T{t}-G{g}-s{s}-{str(d).split('.')[-1]}" for t, g, s, d in GRID]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def make_mask(T: int, G: int, sparsity: float, gen, lead=()) -> torch.Tensor:
    """Random [.., T, G] int32 mask; with G >= 4, group 0 is on everywhere and group 1 off everywhere."""
    m = (torch.rand(*lead, T, G, generator=gen, device="cuda") >= sparsity).to(torch.int32)
    if G >= 4 and 0.0 < sparsity < 1.0:
        m[..., 0] = 1
        m[..., 1] = 0
    return m


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def assert_close(y: torch.Tensor, want: torch.Tensor, dtype) -> None:
    assert not torch.isnan(y).any(), "output left poisoned (NaN) somewhere"
    err = (y.float() - want.float()).abs().max().item()
    scale = max(want.float().abs().max().item(), 1e-3)
    assert err / scale <= REL_TOL[dtype], f"relative error {err / scale:.2e} > {REL_TOL[dtype]:.1e}"


def assert_skipped_zero(y: torch.Tensor, mask: torch.Tensor, gs: int) -> None:
    off = ref.expand_mask(mask, gs, torch.bool).logical_not()
    assert (y[off] == 0).all(), "outputs of skipped groups must be exactly 0"


def _n_sizes(G: int) -> tuple[int, int]:
    """(group_size, K) for the N-pruned ops: N = G * gs stays small, gs a multiple of 8."""
    return {1: 264, 32: 16, 128: 8}[G], 200


@pytest.mark.parametrize("T, G, s, dtype", GRID, ids=GRID_IDS)
def test_gemm_n(gpu_kernels, T, G, s, dtype):
    gen = _gen(T * 131 + G)
    gs, K = _n_sizes(G)
    N = G * gs
    x = torch.randn(T, K, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    bias = torch.randn(N, generator=gen, device="cuda").to(dtype) if T % 2 else None
    mask = make_mask(T, G, s, gen)
    y = gpu_kernels.masked_gemm_n(x, w, mask, gs, bias, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gemm_n(x, w, mask, gs, bias), dtype)
    assert_skipped_zero(y, mask, gs)


@pytest.mark.parametrize("T, G, s, dtype", GRID, ids=GRID_IDS)
def test_gated_mlp(gpu_kernels, T, G, s, dtype):
    gen = _gen(T * 137 + G)
    gs, K = _n_sizes(G)
    N = G * gs
    x = torch.randn(T, K, generator=gen, device="cuda").to(dtype)
    wg = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    wu = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    mask = make_mask(T, G, s, gen)
    y = gpu_kernels.masked_gated_mlp(x, wg, wu, mask, gs, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gated_mlp(x, wg, wu, mask, gs), dtype)
    assert_skipped_zero(y, mask, gs)


@pytest.mark.parametrize("T, G, s, dtype", GRID, ids=GRID_IDS)
def test_gemm_k(gpu_kernels, T, G, s, dtype):
    gen = _gen(T * 139 + G)
    gs = _n_sizes(G)[0]  # the same group sizes, here along K
    K, N = G * gs, 136
    x = torch.randn(T, K, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    mask = make_mask(T, G, s, gen)
    off = ref.expand_mask(mask, gs, torch.bool).logical_not()
    x = x.masked_fill(off, 1.0e4)  # garbage in skipped inputs must be ignored
    y = gpu_kernels.masked_gemm_k(x, w, mask, gs, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gemm_k(x, w, mask, gs), dtype)
    if s == 1.0:
        assert (y == 0).all()


def _check_router(kernels, T, G, s, dtype, H, R, seed):
    gen = _gen(seed)
    h = torch.randn(2, T, H, generator=gen, device="cuda").to(dtype)
    wc = torch.randn(R, H, generator=gen, device="cuda") / H**0.5
    bc = torch.randn(R, generator=gen, device="cuda")
    wr = torch.randn(2 * G, R, generator=gen, device="cuda") / R**0.5
    # sparsity steers the bias of the "skip" logit so the grid also covers all-on / all-off masks
    br = torch.randn(2 * G, generator=gen, device="cuda")
    br[1::2] += {0.0: -50.0, 0.5: 0.0, 0.9: 1.5, 1.0: 50.0}[s]
    mask = kernels.wide_router(h, wc, bc, wr, br, out=torch.full((2, T, G), -7, dtype=torch.int32,
                                                                  device="cuda"))
    want = ref.wide_router(h, wc, bc, wr, br)
    assert mask.dtype == torch.int32 and set(mask.unique().tolist()) <= {0, 1}
    logits = ref.router_logits(h.double(), wc.double(), bc.double(), wr.double(), br.double())
    gap = (logits[..., 0] - logits[..., 1]).abs()
    differ = mask != want
    near_tie = gap <= 1e-4 * (logits.abs().amax(dim=-1) + 1.0)
    assert not (differ & ~near_tie).any(), "router decisions differ away from ties"


@pytest.mark.parametrize("T, G, s, dtype", GRID, ids=GRID_IDS)
def test_router(gpu_kernels, T, G, s, dtype):
    """Fused path (R <= 64)."""
    _check_router(gpu_kernels, T, G, s, dtype, H=192, R=48, seed=T * 149 + G)


@pytest.mark.parametrize("T", (1, 7, 1000))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_router_wide_compressor_and_long_hidden(gpu_kernels, T, dtype):
    """R > 64 takes the generic two-linear path; a long H splits into many slices."""
    _check_router(gpu_kernels, T, 32, 0.5, dtype, H=200, R=80, seed=T)
    _check_router(gpu_kernels, T, 32, 0.5, dtype, H=4096 + 40, R=16, seed=T + 1)


# ---------------------------------------------------------------------------
# Odd shapes, float32, strides, forced algorithms, shared layout
ODD = [  # (T, K, G, gs): K % 8 != 0, gs not a multiple of 8, tiny and ragged sizes
    (1, 37, 3, 5), (3, 37, 7, 3), (9, 37, 5, 11), (130, 101, 6, 7), (257, 64, 1, 13), (1000, 45, 9, 9),
]


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("T, K, G, gs", ODD)
def test_odd_shapes_all_ops(gpu_kernels, T, K, G, gs, dtype):
    gen = _gen(T + K + G + gs)
    N = G * gs
    x = torch.randn(T, K, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    w2 = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    bias = torch.randn(N, generator=gen, device="cuda").to(dtype)
    mask = make_mask(T, G, 0.5, gen)
    y = gpu_kernels.masked_gemm_n(x, w, mask, gs, bias, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gemm_n(x, w, mask, gs, bias), dtype)
    y = gpu_kernels.masked_gated_mlp(x, w, w2, mask, gs, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gated_mlp(x, w, w2, mask, gs), dtype)
    # K-pruned: reduction K' = G * gs, output width K
    xk = torch.randn(T, N, generator=gen, device="cuda").to(dtype)
    wk = (torch.randn(K, N, generator=gen, device="cuda") / N**0.5).to(dtype)
    y = gpu_kernels.masked_gemm_k(xk, wk, mask, gs, out=poisoned((T, K), dtype))
    assert_close(y, ref.masked_gemm_k(xk, wk, mask, gs), dtype)


@pytest.mark.parametrize("algo", ("auto", "dense", "sparse"))
@pytest.mark.parametrize("T", (3, 300, 2048))
@pytest.mark.parametrize("dtype", DTYPES)
def test_forced_algorithms_agree(gpu_kernels, algo, T, dtype):
    gen = _gen(T + len(algo))
    G, gs, K = 32, 24, 256
    N = G * gs
    x = torch.randn(2, T, K, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    wu = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    for s in (0.3, 0.95):
        mask = make_mask(T, G, s, gen, lead=(2,))
        y = gpu_kernels.masked_gemm_n(x, w, mask, gs, algo=algo, out=poisoned((2, T, N), dtype))
        assert_close(y, ref.masked_gemm_n(x, w, mask, gs), dtype)
        assert_skipped_zero(y, mask, gs)
        y = gpu_kernels.masked_gated_mlp(x, w, wu, mask, gs, algo=algo, out=poisoned((2, T, N), dtype))
        assert_close(y, ref.masked_gated_mlp(x, w, wu, mask, gs), dtype)
        wk = (torch.randn(K, N, generator=gen, device="cuda") / N**0.5).to(dtype)
        xk = torch.randn(2, T, N, generator=gen, device="cuda").to(dtype)
        y = gpu_kernels.masked_gemm_k(xk, wk, mask, gs, algo=algo, out=poisoned((2, T, K), dtype))
        assert_close(y, ref.masked_gemm_k(xk, wk, mask, gs), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows_and_shared_layout(gpu_kernels, dtype):
    gen = _gen(7)
    T, G, gs, K = 777, 16, 40, 128
    N = G * gs
    big = torch.randn(T, K + 24, generator=gen, device="cuda").to(dtype)
    x = big[:, 8 : 8 + K]  # ldx = K + 24, 16-byte aligned start
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    wu = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    mask_full = make_mask(T, G + 3, 0.6, gen)
    mask = mask_full[:, :G]  # ldmask = G + 3
    layout = gpu_kernels.mask_layout(mask)
    counts = layout[:G].cpu()
    assert torch.equal(counts, mask.sum(0).cpu().to(torch.int32))
    rows = layout[G:].view(G, T).cpu()
    for g in (0, 5, G - 1):
        assert torch.equal(rows[g, : counts[g]], mask[:, g].cpu().nonzero().flatten().to(torch.int32))
    out = torch.full((T, N + 8), float("nan"), dtype=dtype, device="cuda")[:, :N]
    y = gpu_kernels.masked_gemm_n(x, w, mask, gs, layout=layout, out=out)
    assert_close(y, ref.masked_gemm_n(x, w, mask, gs), dtype)
    y = gpu_kernels.masked_gated_mlp(x, w, wu, mask, gs, layout=layout, algo="sparse")
    assert_close(y, ref.masked_gated_mlp(x, w, wu, mask, gs), dtype)


def test_repeated_calls_are_deterministic(gpu_kernels):
    gen = _gen(11)
    T, G, gs, K = 1000, 32, 64, 512
    x = torch.randn(T, K, generator=gen, device="cuda").half()
    w = (torch.randn(G * gs, K, generator=gen, device="cuda") / K**0.5).half()
    mask = make_mask(T, G, 0.5, gen)
    a = gpu_kernels.masked_gemm_n(x, w, mask, gs)
    b = gpu_kernels.masked_gemm_n(x, w, mask, gs)
    assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ("auto", "sparse"))
@pytest.mark.parametrize("T", (12, 100))
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_k_few_tiles_long_reduction(gpu_kernels, algo, T, dtype):
    """Few output tiles and a long K: the library splits K and finishes in a second pass."""
    gen = _gen(T + 3)
    G, gs, K = 8, 32, 4096
    N = G * gs
    x = torch.randn(T, K, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    wu = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(dtype)
    bias = torch.randn(N, generator=gen, device="cuda").to(dtype)
    mask = make_mask(T, G, 0.5, gen)
    y = gpu_kernels.masked_gemm_n(x, w, mask, gs, bias, algo=algo, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gemm_n(x, w, mask, gs, bias), dtype)
    assert_skipped_zero(y, mask, gs)
    y = gpu_kernels.masked_gated_mlp(x, w, wu, mask, gs, algo=algo, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gated_mlp(x, w, wu, mask, gs), dtype)
    gk = 512  # K-pruned: 8 groups of 512 over the 4096 inputs
    mk = make_mask(T, K // gk, 0.5, gen)
    xk = x.masked_fill(ref.expand_mask(mk, gk, torch.bool).logical_not(), 1.0e4)
    y = gpu_kernels.masked_gemm_k(xk, w, mk, gk, algo=algo, out=poisoned((T, N), dtype))
    assert_close(y, ref.masked_gemm_k(xk, w, mk, gk), dtype)
