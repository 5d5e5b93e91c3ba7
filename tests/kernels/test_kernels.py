"""The Triton kernels themselves against the PyTorch references (wide_export.ops.reference).

On CPU (every CI run) the kernels execute in Triton's interpreter: tile
mapping, row lists, masks, K and N tails, dtypes. On a GPU (marker `gpu`) the
same tests run the compiled kernels over larger shapes. Inputs are fresh
random tensors per case; masked-off inputs of the K-pruned op hold large
garbage that must not leak; skipped outputs must be exactly zero.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from wide_export import kernels
from wide_export.ops import reference as ref

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# max |y - ref| / max(1, max |ref|): float32 accumulation everywhere, so this is output rounding + order.
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}
ALGOS = ("gemv", "grouped", "tile")
KINDS = ("n", "n_bias", "gated", "k", "k_bias")
# (lead shape, group_size, groups, sparsity): K/N tails (24, 40 are not block multiples), M = 1 .. 2x70.
CPU_SHAPES = (((1,), 16, 4, 0.5), ((2, 3), 32, 3, 0.5), ((2, 35), 48, 2, 0.5), ((70,), 16, 5, 0.0),
              ((70,), 16, 5, 1.0), ((9,), 24, 5, 0.5), ((33,), 40, 3, 0.7))
# GPU: Llama-sized widths; float32 only on the first shape (each new specialization costs a JIT compile).
GPU_SHAPES = (((2, 150), 64, 64, 0.5), ((1,), 128, 32, 0.5), ((4,), 512, 8, 0.5), ((4096,), 128, 112, 0.5),
              ((4096,), 32, 128, 0.75), ((17,), 96, 16, 0.5))
# indices into GPU_SHAPES: decode and 300 rows (64-row tiles); the 4096-row shapes' 128-row tiles run in bf16
# only on the GPU (fp16 there cost 6 more cold compiles than the budget has), in both on CPU
GPU_FP16_SHAPES = (0, 1)


def _case_seed(*parts) -> int:
    return abs(hash(tuple(str(p) for p in parts))) % (2**31)


def make_inputs(kind, lead, gs, G, sparsity, dtype, device, seed, other=None, edge_tokens=False):
    """edge_tokens: the first token skips every group, the last executes every group (when M >= 2)."""
    gen = torch.Generator().manual_seed(seed)
    other = other or (200 if device == "cpu" else 1024)  # the non-grouped width
    N, K = (other, G * gs) if kind.startswith("k") else (G * gs, other)
    x = torch.randn(*lead, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)
    w2 = (torch.randn(N, K, generator=gen) / K**0.5).to(dtype)
    b = torch.randn(N, generator=gen).to(dtype)
    mask = (torch.rand(*lead, G, generator=gen) >= sparsity).to(torch.int32)
    if edge_tokens and mask.numel() // G >= 2:
        flat = mask.view(-1, G)
        flat[0] = 0
        flat[-1] = 1
    if kind.startswith("k"):  # garbage in skipped input groups must be ignored
        keep = mask.bool().repeat_interleave(gs, dim=-1)
        x = torch.where(keep, x, torch.full_like(x, 3e3 if dtype != torch.float16 else 3e2))
    t = {k: v.to(device) for k, v in dict(x=x, w=w, w2=w2, b=b, mask=mask).items()}
    return t


def run(kind, t, gs, algo, tiles="auto"):
    if kind.startswith("k"):  # k_bias: the o_proj bias of attention_bias checkpoints, added to every output
        bias = t["b"] if kind == "k_bias" else None
        return (kernels.masked_gemm_k(t["x"], t["w"], t["mask"], gs, bias, algo=algo, tiles=tiles),
                ref.masked_gemm_k(t["x"], t["w"], t["mask"], gs, bias))
    if kind == "gated":
        return (kernels.masked_gated_mlp(t["x"], t["w"], t["w2"], t["mask"], gs, algo=algo, tiles=tiles),
                ref.masked_gated_mlp(t["x"], t["w"], t["w2"], t["mask"], gs))
    bias = t["b"] if kind == "n_bias" else None
    return (kernels.masked_gemm_n(t["x"], t["w"], t["mask"], gs, bias, algo=algo, tiles=tiles),
            ref.masked_gemm_n(t["x"], t["w"], t["mask"], gs, bias))


def check(kind, got, want, t, gs, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got.float()).all()
    err = (got.float() - want.float()).abs().max().item()
    scale = max(1.0, want.float().abs().max().item())
    assert err <= TOL[dtype] * scale, f"max error {err:.3g} (scale {scale:.3g})"
    if not kind.startswith("k"):  # outputs of skipped groups are exactly zero
        off = ~t["mask"].bool().repeat_interleave(gs, dim=-1)
        assert (got[off] == 0).all()


def _on_gpu(kind, dtype, i) -> bool:
    """The GPU subset: every JIT specialisation is a cold compile (~1 s) inside gpu-check.sh's one 480 s run
    (tests/kernels/test_gpu_budget.py bounds their count). bf16 (the default dtype) everywhere; fp16 on the
    decode and the 300-token shapes; fp32 on the first shape only; the bias variants in bf16 only."""
    if dtype == torch.float32:
        return i == 0 and not kind.endswith("bias")
    if dtype == torch.float16:
        return i in GPU_FP16_SHAPES and not kind.endswith("bias")
    return True


def _params(shapes, gpu=False):
    for kind, algo, dtype, shape in itertools.product(KINDS, ALGOS, DTYPES, shapes):
        lead, gs, G, s = shape
        if algo == "grouped" and not kind.startswith("k") and gs % 16:
            continue  # grouped N needs a 16-multiple group size (tile covers the rest)
        if gpu and not _on_gpu(kind, dtype, shapes.index(shape)):
            continue
        yield pytest.param(kind, algo, dtype, shape,
                           id=f"{kind}-{algo}-{str(dtype)[6:]}-M{'x'.join(map(str, lead))}-gs{gs}-G{G}-s{s}")


@pytest.mark.parametrize("kind,algo,dtype,shape", list(_params(CPU_SHAPES)))
def test_masked_gemm_cpu_interpreter(kind, algo, dtype, shape):
    lead, gs, G, s = shape
    t = make_inputs(kind, lead, gs, G, s, dtype, "cpu", _case_seed(kind, algo, dtype, shape))
    got, want = run(kind, t, gs, algo)
    check(kind, got, want, t, gs, dtype)


# Decode (gemv): K long enough for several 128-wide K chunks (split-K) and N for several 8-wide output tiles;
# group sizes that are no multiple of the blocks (12 vs 8 outputs, 160 and 48 vs 128-wide chunks), K and N
# tails, a first token that skips every group and a last one that executes all. `sms` re-plans the grid:
# 132 (H200) gives one chunk per split, 6 several chunks per split, 1 a single split writing y directly.
# The non-grouped width: N = 300 for K-pruned, K = 800 (4 chunks of 256, tail 32) for N-pruned.
DECODE_CASES = (("k", (1,), 160, 5, 0.5), ("k", (3,), 128, 4, 0.5), ("k", (2, 4), 48, 9, 0.5),
                ("k", (1,), 128, 3, 1.0), ("n", (1,), 12, 7, 0.5), ("n", (5,), 24, 3, 0.5), ("n", (2,), 16, 4, 1.0))
FAMILY = {"k": ("k", "k_bias"), "n": ("n", "n_bias", "gated")}


def _decode_params():
    for fam, lead, gs, G, s in DECODE_CASES:
        for kind, dtype in itertools.product(FAMILY[fam], DTYPES):
            for sms in ((132, 6, 1) if dtype == torch.float32 else (132,)):
                yield pytest.param(kind, dtype, (lead, gs, G, s), sms,
                                   id=f"{kind}-{str(dtype)[6:]}-M{'x'.join(map(str, lead))}-gs{gs}-G{G}-s{s}-sms{sms}")


@pytest.mark.parametrize("kind,dtype,shape,sms", list(_decode_params()))
def test_gemv_decode_paths_cpu_interpreter(kind, dtype, shape, sms, monkeypatch):
    from wide_export.kernels import launch

    monkeypatch.setattr(launch, "sm_count", lambda device: sms)
    lead, gs, G, s = shape
    t = make_inputs(kind, lead, gs, G, s, dtype, "cpu", _case_seed("decode", kind, dtype, shape, sms),
                    other=300 if kind.startswith("k") else 800, edge_tokens=True)
    got, want = run(kind, t, gs, "gemv")
    check(kind, got, want, t, gs, dtype)
    if kind.startswith("k") and s == 1.0:  # every input group skipped: exactly the bias (or zero)
        exact = t["b"].expand_as(got) if kind == "k_bias" else torch.zeros_like(got)
        assert torch.equal(got, exact)


@pytest.mark.gpu
@pytest.mark.parametrize("kind,algo,dtype,shape", list(_params(GPU_SHAPES, gpu=True)))
def test_masked_gemm_gpu(kind, algo, dtype, shape):
    lead, gs, G, s = shape
    t = make_inputs(kind, lead, gs, G, s, dtype, "cuda", _case_seed(kind, algo, dtype, shape))
    got, want = run(kind, t, gs, algo)
    check(kind, got, want, t, gs, dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("M", (1, 3, 40))
def test_auto_runs_a_kernel_on_cpu(kind, M):
    """`auto` on CPU picks one of the kernels (never a torch fallback) and matches the reference."""
    from wide_export.kernels import launch, policy

    algo = policy.choose({"n_bias": "n", "k_bias": "k"}.get(kind, kind), M, 16, policy.policy_for("interpreter"))
    assert algo in ("gemv", "grouped", "tile")
    t = make_inputs(kind, (M,), 16, 3, 0.5, torch.float32, "cpu", _case_seed("auto", kind, M))
    got, want = run(kind, t, 16, "auto")
    check(kind, got, want, t, 16, torch.float32)
    assert launch.interpreted()


def _router_inputs(lead, H, R, G, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, H, generator=gen).to(dtype)
    wc = torch.randn(R, H, generator=gen) / H**0.5
    bc = torch.randn(R, generator=gen) * 0.1
    wr = torch.randn(2 * G, R, generator=gen) / R**0.5
    br = torch.randn(2 * G, generator=gen) * 0.1
    return [v.to(device) for v in (x, wc, bc, wr, br)]


def _check_router(x, wc, bc, wr, br):
    got = kernels.router(x, wc, bc, wr, br)
    want = ref.wide_router(x, wc, bc, wr, br)
    assert got.dtype == torch.int32 and got.shape == want.shape
    logits = ref.router_logits(x, wc, bc, wr, br)
    clear = (logits[..., 0] - logits[..., 1]).abs() > 1e-4  # near-ties may round either way
    assert clear.float().mean() > 0.9
    assert torch.equal(got[clear], want[clear])
    if want.numel() >= 10:
        assert 0.2 < want.float().mean() < 0.8  # genuinely mixed decisions


# M <= 64: the split router (H tail 200 % 16, R tails 100 % 8 and 24 % 8 = 0); M > 64: the fused one, at
# each of its H steps (configs.router_tile: BLOCK_R 32 -> H step 64, 128 -> 32, 256 -> 16; H tails 72 % 64,
# 100 % 32, 72 % 16).
ROUTER_CASES = (((1,), 64, 16, 4), ((2, 5), 96, 24, 5), ((37,), 200, 100, 18), ((3,), 48, 256, 1),
                ((70,), 72, 20, 3), ((66,), 100, 100, 4), ((65,), 72, 200, 2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ROUTER_CASES, ids=lambda c: f"M{'x'.join(map(str, c[0]))}-H{c[1]}-R{c[2]}-G{c[3]}")
def test_router_cpu_interpreter(case, dtype):
    lead, H, R, G = case
    _check_router(*_router_inputs(lead, H, R, G, dtype, "cpu", _case_seed("router", case, dtype)))


@pytest.mark.parametrize("sms", (1, 3))
def test_router_split_with_few_splits_cpu_interpreter(sms, monkeypatch):
    """Fewer, longer splits (several H chunks each, or a single split) decide the same."""
    from wide_export.kernels import launch

    monkeypatch.setattr(launch, "sm_count", lambda device: sms)
    assert launch.router_plan(4, 200, 40, sms).chunks_per_split > 1
    _check_router(*_router_inputs((4,), 200, 40, 6, torch.float32, "cpu", _case_seed("router-few", sms)))


GPU_ROUTER_CASES = (((1,), 4096, 128, 8), ((4096,), 4096, 128, 112), ((7,), 2048, 64, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GPU_ROUTER_CASES)
def test_router_gpu(case, dtype):
    lead, H, R, G = case
    _check_router(*_router_inputs(lead, H, R, G, dtype, "cuda", _case_seed("router", case, dtype)))


def test_group_rows_kernel_lists_executing_rows_first():
    """The row lists of the grouped algorithms, checked against a hand count."""
    from wide_export.kernels import launch

    gen = torch.Generator().manual_seed(3)
    mask = (torch.rand(1500, 4, generator=gen) < 0.4).to(torch.int32)  # M > one 1024-row block
    mask[:, 3] = 0
    rows, counts = launch.group_rows(mask)
    for g in range(4):
        on = torch.nonzero(mask[:, g]).flatten().to(torch.int32)
        off = torch.nonzero(mask[:, g] == 0).flatten().to(torch.int32)
        assert counts[g].item() == on.numel()
        assert torch.equal(rows[g], torch.cat([on, off]))


@pytest.mark.parametrize("bad,match", [
    (dict(mask_dtype=torch.int64), "int32"),
    (dict(group_size=7), "multiple of group_size"),
    (dict(group_size=0), "positive int"),
    (dict(algo="fast"), "algo must be one of"),
    (dict(w_dtype=torch.float16), "dtype"),
    (dict(mask_groups=5), "shape"),
])
def test_validation_errors_are_clear(bad, match):
    x = torch.randn(3, 32)
    w = torch.randn(64, 32).to(bad.get("w_dtype", torch.float32))
    mask = torch.ones(3, bad.get("mask_groups", 4), dtype=bad.get("mask_dtype", torch.int32))
    with pytest.raises(ValueError, match=match):
        kernels.masked_gemm_n(x, w, mask, bad.get("group_size", 16), algo=bad.get("algo", "auto"))


def test_grouped_refuses_group_size_it_cannot_tile():
    x, w, mask = torch.randn(3, 32), torch.randn(48, 32), torch.ones(3, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="tile"):
        kernels.masked_gemm_n(x, w, mask, 24, algo="grouped")


# The tile GEMMs walk their grid GROUP_M row tiles at a time (sources._tile_order, the L2 swizzle): 650 rows are
# 11 row tiles of 64, so GROUP_M 8 leaves a last band of 3 and GROUP_M 3 one of 2; every (row tile, column
# tile) must still be computed exactly once. Seen failing with the last band's height taken as GROUP_M.
@pytest.mark.parametrize("group_m", (8, 3))
@pytest.mark.parametrize("kind", ("gated", "k_bias"))
def test_tile_order_covers_every_tile_cpu_interpreter(kind, group_m, monkeypatch):
    from wide_export.kernels import configs as cfg
    monkeypatch.setattr(cfg, "TILE_GROUP_M", group_m)
    gs, G = 48, 4  # N or K = 192: 3 column tiles of 64 for N-pruned; K-pruned: N = 200, 4 with a tail
    t = make_inputs(kind, (650,), gs, G, 0.5, torch.float32, "cpu", _case_seed("order", kind, group_m))
    got, want = run(kind, t, gs, "tile")
    check(kind, got, want, t, gs, torch.float32)


# The 128-row tiles of large prefills (configs.LARGE_*, sm_90 from the policy's prefill_tiles buckets; the
# interpreter's policy takes them from 129 rows): 300 rows are two full row tiles and a tail of 44; 4 groups of 128 (the
# grouped gated GEMM's large tile is 64 wide: two per group), the other width 200.
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("algo", ("grouped", "tile"))
@pytest.mark.parametrize("kind", KINDS)
def test_large_tiles_cpu_interpreter(kind, algo, dtype, monkeypatch):
    from wide_export.kernels import launch

    seen = []
    real = launch._launch
    monkeypatch.setattr(launch, "_launch", lambda kernel, grid, *a, **kw: (seen.append(kw), real(kernel, grid, *a,
                                                                                                 **kw))[1])
    gs, G = 128, 4
    t = make_inputs(kind, (300,), gs, G, 0.5, dtype, "cpu", _case_seed("large", kind, algo, dtype), edge_tokens=True)
    got, want = run(kind, t, gs, algo)  # auto tiles: 300 rows are in the interpreter's large bucket
    check(kind, got, want, t, gs, dtype)
    gemm = [kw for kw in seen if "BLOCK_K" in kw and "BLOCK_M" in kw]
    large = algo == "tile" or not kind.startswith("k")  # the K-pruned grouped GEMM has no large tile
    assert [kw["BLOCK_M"] for kw in gemm] == [128 if large else 64], gemm
    seen.clear()
    small, _ = run(kind, t, gs, algo, tiles="small")
    check(kind, small, want, t, gs, dtype)
    assert [kw["BLOCK_M"] for kw in seen if "BLOCK_K" in kw and "BLOCK_M" in kw] == [64]


# The 128 x 256 tiles (configs.WIDE_*, tile_n plain / bias and tile_k): forced, or from a policy whose bucket
# says so; an unaligned call (the non-grouped width 200) steps down to the 128 x 128 tile, as the C runtime
# does (it has no unaligned wide cubin). 300 rows: two full row tiles and a tail; N-pruned N = 512, two
# column tiles; K-pruned N = 256 (aligned) or 200 (a tail).
@pytest.mark.parametrize("how", ("forced", "auto"))
@pytest.mark.parametrize("aligned", (True, False))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("kind", ("n", "n_bias", "k", "k_bias"))
def test_wide_tiles_cpu_interpreter(kind, dtype, aligned, how, monkeypatch):
    from wide_export.kernels import launch
    from wide_export.kernels.policy import policy_for

    seen = []
    real = launch._launch
    monkeypatch.setattr(launch, "_launch", lambda kernel, grid, *a, **kw: (seen.append(kw), real(kernel, grid, *a,
                                                                                                 **kw))[1])
    if how == "auto":
        table = policy_for("interpreter")
        tiles = {**table["prefill_tiles"], "tile_n": [[0, "small"], [300, "wide"]], "tile_k": [[0, "small"],
                                                                                              [300, "wide"]]}
        monkeypatch.setattr(launch, "policy_for", lambda arch, device=None: {**table, "prefill_tiles": tiles})
    gs, G = 128, 4
    t = make_inputs(kind, (300,), gs, G, 0.5, dtype, "cpu", _case_seed("wide", kind, dtype, aligned, how),
                    other=256 if aligned else 200, edge_tokens=True)
    got, want = run(kind, t, gs, "tile", tiles="wide" if how == "forced" else "auto")
    check(kind, got, want, t, gs, dtype)
    gemm = [(kw["BLOCK_M"], kw["BLOCK_N"], kw.get("num_warps")) for kw in seen if "BLOCK_K" in kw]
    assert gemm == [(128, 256, 8) if aligned else (128, 128, 8)], gemm
    if how == "forced" and kind == "n":  # the gated and grouped families have no wide tile: their largest
        for other, algo, want in (("gated", "tile", (128, 64)), ("gated", "grouped", (128, 64)),
                                  ("n", "grouped", (128, 128))):
            seen.clear()
            o = make_inputs(other, (300,), gs, G, 0.5, dtype, "cpu", _case_seed("wide", other, algo, dtype, aligned),
                            other=256 if aligned else 200)
            got, want_y = run(other, o, gs, algo, tiles="wide")
            check(other, got, want_y, o, gs, dtype)
            assert [(kw["BLOCK_M"], kw["BLOCK_N"]) for kw in seen if "BLOCK_K" in kw] == [want], (other, algo)
    if how == "auto":  # one row fewer: under the wide bucket, the small tile
        seen.clear()
        t299 = {k: (v[:299] if k in ("x", "mask") else v) for k, v in t.items()}
        got, want = run(kind, t299, gs, "tile")
        check(kind, got, want, t299, gs, dtype)
        assert [(kw["BLOCK_M"], kw["BLOCK_N"]) for kw in seen if "BLOCK_K" in kw] == [(64, 64)]
