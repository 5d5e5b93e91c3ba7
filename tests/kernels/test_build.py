"""The CMake build of plugins/kernels (Triton AOT cubins + C API), exercised without a GPU."""

from __future__ import annotations

import ctypes
import json
import re

import pytest

from wide_export.base.errors import WideError
from wide_export.kernels import aot, configs
from wide_export.native.build import configure_command, normalize_archs

from .conftest import TEST_ARCHS


class GemmParams(ctypes.Structure):
    """Mirror of wide_gemm_params_t (its size is checked against the library's)."""

    _fields_ = [("M", ctypes.c_int64), ("N", ctypes.c_int64), ("K", ctypes.c_int64), ("group_size", ctypes.c_int64),
                ("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("w2", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("mask", ctypes.c_void_p), ("y", ctypes.c_void_p), ("dtype", ctypes.c_int), ("algo", ctypes.c_int)]


def _params(**kw) -> GemmParams:
    """Valid-looking params with fake (never dereferenced) device pointers."""
    base = dict(M=16, N=64, K=32, group_size=16, x=0x1000, w=0x2000, mask=0x3000, y=0x4000, dtype=1, algo=0)
    base.update(kw)
    return GemmParams(**base)


class AttentionParams(ctypes.Structure):
    """Mirror of wide_attention_params_t (its size is checked against the library's)."""

    _fields_ = [(n, ctypes.c_int64) for n in ("B", "Hq", "Hk", "T", "S", "D", "group_heads")] + [
        (n, ctypes.c_void_p) for n in ("q", "k", "v", "allowed", "head_mask", "y")] + [("dtype", ctypes.c_int)]


def _attention(**kw) -> AttentionParams:
    """Valid-looking attention params with fake (never dereferenced) device pointers."""
    base = dict(B=2, Hq=32, Hk=8, T=100, S=100, D=128, group_heads=4, q=0x1000, k=0x2000, v=0x3000, allowed=0x4000,
                head_mask=0x5000, y=0x6000, dtype=1)
    base.update(kw)
    return AttentionParams(**base)


def _archs() -> list[int]:
    return [int(a) for a in normalize_archs(TEST_ARCHS).split(";")]


def test_build_embeds_a_cubin_for_every_spec_and_arch(kernels_build, kernels_lib):
    names = {p.name for p in kernels_build.libraries}
    assert {"libwide_kernels.so", "libwide_kernels_static.a"} <= names
    cache = (kernels_build.build_dir / "CMakeCache.txt").read_text()
    assert re.search(rf"^CMAKE_CUDA_ARCHITECTURES:\w+={re.escape(TEST_ARCHS)}$", cache, re.M)
    keys = aot.keys()
    assert kernels_lib.wide_kernels_cubin_count() == sum(len(aot.arch_specs(a)) for a in _archs())
    for key in keys:
        for arch in _archs():
            want = not key.endswith(("/large", "/wide")) or arch // 10 == 9  # the 128-row tiles: sm_90 only
            assert kernels_lib.wide_kernels_has_cubin(key.encode(), arch) == want, (key, arch)
    assert not kernels_lib.wide_kernels_has_cubin(b"tile_n/bfloat16/gated/large", 86)
    assert not kernels_lib.wide_kernels_has_cubin(b"tile_n/float32/gated/large", 90)  # fp32: none
    assert not kernels_lib.wide_kernels_has_cubin(b"grouped_n/bfloat16/gated/bn128/large", 90)  # gated: <= 64
    if 90 in _archs():  # 128 x 256: tile_n plain / bias and tile_k, fp16 / bf16, sm_90, a16 only
        for key in (b"tile_n/float16/plain/wide", b"tile_n/bfloat16/bias/wide", b"tile_k/bfloat16/wide",
                    b"tile_k/float16/bias/wide"):
            assert kernels_lib.wide_kernels_has_cubin(key, 90), key
    for key in (b"tile_n/bfloat16/gated/wide", b"tile_n/float32/plain/wide", b"grouped_n/float16/plain/bn128/wide"):
        assert not kernels_lib.wide_kernels_has_cubin(key, 90), key
    assert not kernels_lib.wide_kernels_has_cubin(b"tile_n/float16/plain/wide", 86)
    # an sm_86 GPU runs the sm_80 cubins; Blackwell (sm_100) has none in this build
    assert kernels_lib.wide_kernels_has_cubin(b"gemv_k/float16", 86) == (80 in _archs())
    for key in (b"gemv_k/bfloat16/bias", b"tile_k/float32/bias", b"cast/float16/bias"):  # the o_proj bias
        assert kernels_lib.wide_kernels_has_cubin(key, 86) == (80 in _archs()), key
    assert not kernels_lib.wide_kernels_has_cubin(b"gemv_k/float16", 100)
    assert not kernels_lib.wide_kernels_has_cubin(b"no/such/kernel", 90)


def test_sm90_cubins_use_wgmma_and_sm80_mma_sync(kernels_build):
    """The tensor-core kernels compile to Hopper wgmma on sm_90 (HGMMA) and mma.sync on sm_80."""
    if not {80, 90} <= set(_archs()):
        pytest.skip("needs a build for both sm_80 and sm_90")
    ptx = {arch: aot.compile_spec_ptx("grouped_n/float16/gated/bn128", arch) for arch in (80, 90)}
    assert "wgmma" in ptx[90] and "mma.sync" in ptx[80] and "wgmma" not in ptx[80]


def test_library_reports_its_api(kernels_lib):
    assert kernels_lib.wide_kernels_api_version() == 5
    assert kernels_lib.wide_gemm_params_sizeof() == ctypes.sizeof(GemmParams)
    assert kernels_lib.wide_attention_params_sizeof() == ctypes.sizeof(AttentionParams)
    assert kernels_lib.wide_status_string(0) == b"ok"
    assert b"workspace" in kernels_lib.wide_status_string(3)
    assert b"architecture" in kernels_lib.wide_status_string(5)


@pytest.mark.parametrize(
    "fn, changes, status",
    [
        ("wide_gemm_n", dict(group_size=15), 1),          # N != G * gs
        ("wide_gemm_k", dict(group_size=20), 1),          # K != G * gs for gemm_k
        ("wide_gemm_n", dict(x=None), 1),                  # NULL input
        ("wide_gemm_n", dict(w2=0x5000), 1),               # w2 only for the gated op
        ("wide_gemm_n_gated", dict(), 1),                  # gated without w2
        ("wide_gemm_k", dict(w2=0x6000), 1),               # w2 only for the gated op (a bias is fine: o_proj)
        ("wide_gemm_n", dict(dtype=7), 2),                 # unknown dtype
        ("wide_gemm_n", dict(algo=9), 1),                  # unknown algo
        ("wide_gemm_n", dict(algo=2, group_size=8, N=64), 1),  # grouped needs group_size % 16 == 0
        ("wide_gemm_n", dict(algo=2, dtype=0), 1),         # no grouped cubins for float32
        ("wide_gemm_n", dict(M=1 << 20, K=4096), 1),       # i32 index range
    ],
)
def test_c_api_rejects_bad_arguments_before_touching_cuda(kernels_lib, fn, changes, status):
    p = _params(**changes)
    assert getattr(kernels_lib, fn)(ctypes.byref(p), None, ctypes.c_size_t(0), None) == status


def test_empty_problem_and_monotonic_workspace(kernels_lib):
    assert kernels_lib.wide_gemm_n(ctypes.byref(_params(M=0)), None, ctypes.c_size_t(0), None) == 0
    sizes = [kernels_lib.wide_gemm_workspace_size(ctypes.byref(_params(M=m, N=4096, K=14336, group_size=128)))
             for m in (1, 16, 4096, 16384)]
    assert sizes == sorted(sizes) and sizes[0] > 0
    # K-pruned scatter-add at M = 4096: row lists of 112 groups + a float32 [M, N] accumulator
    assert sizes[2] >= 4 * (112 * 4096 + 112) + 4 * 4096 * 4096
    # router: R above the fused limit is refused before any CUDA call
    args = [ctypes.c_void_p(0x1000), 1, ctypes.c_int64(8), ctypes.c_int64(64), ctypes.c_void_p(0x2000),
            ctypes.c_void_p(0x3000), ctypes.c_int64(300), ctypes.c_void_p(0x4000), ctypes.c_void_p(0x5000),
            ctypes.c_int64(4), ctypes.c_void_p(0x6000), None]
    assert kernels_lib.wide_router(*args) == 1
    assert kernels_lib.wide_router_ws(*args[:-1], None, ctypes.c_size_t(0), None) == 1
    # the split router's partials (launch.router_plan): T = 1, H = 4096, R = 64 -> 64 splits x 64 floats
    kernels_lib.wide_router_workspace_size.restype = ctypes.c_size_t
    rsizes = [kernels_lib.wide_router_workspace_size(ctypes.c_int64(m), ctypes.c_int64(4096), ctypes.c_int64(64))
              for m in (1, 8, 64, 65, 4096)]
    assert rsizes == sorted(rsizes) and rsizes[0] >= 64 * 64 * 4


def test_c_auto_policy_matches_python(kernels_lib):
    """The C runtime resolves `auto` from the same policy.json table as wide_export.kernels."""
    from wide_export.kernels.policy import choose, policy_for

    names = {1: "gemv", 2: "grouped", 3: "tile", 4: "dense"}
    dense = "dense" if kernels_lib.wide_kernels_has_cublaslt() else "tile"  # no cuBLASLt: the tile kernels
    for arch in (80, 90):
        pol = policy_for(f"sm_{arch}")
        for kind, kind_k in (("n", 0), ("k", 1), ("gated", 2)):  # gemv_max_m is per kind
            for M in (1, 2, 3, 64, 1023, 1024, 8192):
                for gs in (16, 32, 64, 128, 512, 96):
                    p = _params(M=M, N=gs * 4, K=gs * 4, group_size=gs)
                    got = names[kernels_lib.wide_gemm_resolve_algo(ctypes.byref(p), kind_k, arch)]
                    want = choose(kind, M, gs, pol, gs * 4, gs * 4)
                    want = dense if want == "dense" else want
                    assert got == want, (arch, kind, M, gs)


# ---------------------------------------------------------------------------
# Variant choice: the a16 cubin only when the call is 16-aligned the way it was compiled to assume.
def _describe(lib, op, arch=90, ws=None, ws_size=0, **kw):
    p = _params(**kw)
    buf = ctypes.create_string_buffer(512)
    status = lib.wide_gemm_describe(ctypes.byref(p), op, arch, ctypes.c_void_p(ws), ctypes.c_size_t(ws_size), buf,
                                    ctypes.c_size_t(len(buf)))
    return status, buf.value.decode()


def _want_a16(kw, algo, op, ws):
    """Hand rule (independent of aot.py): the pointers the GEMM kernel itself receives and N, K, group_size
    (K is the row stride too) multiples of 16; M and the group count G do not matter. The grouped kernels
    read row lists from the workspace instead of the mask, and the K-pruned one writes a float32
    accumulator there (its cast kernel reads the bias and writes y)."""
    names = {1: ("x", "w", "w2", "bias", "mask", "y"), 3: ("x", "w", "w2", "bias", "mask", "y"),
             2: ("x", "w") if op == 2 else ("x", "w", "w2", "bias", "y")}[algo]
    ptrs = [kw[n] for n in names if kw.get(n)] + ([ws] if algo == 2 else [])
    return all(v % 16 == 0 for v in ptrs + [kw["N"], kw["K"], kw["group_size"]])


_ALIGNED = dict(M=300, N=384, K=256, group_size=32, x=0x1000, w=0x2000, mask=0x3000, y=0x4000)
_CHANGES = [dict(), dict(M=301), dict(N=48, group_size=16), dict(x=0x1002), dict(w=0x2008), dict(y=0x4004),
            dict(mask=0x3004), dict(K=264), dict(K=250), dict(N=392, group_size=8), dict(bias=0x5000),
            dict(bias=0x5002)]


@pytest.mark.parametrize("algo, op", [(3, 0), (3, 1), (3, 2), (1, 0), (1, 2), (2, 0), (2, 1), (2, 2)])
@pytest.mark.parametrize("dtype", [1, 2, 0])
@pytest.mark.parametrize("change", _CHANGES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "aligned")
def test_runtime_picks_the_aligned_variant_only_when_the_call_is_aligned(kernels_lib, algo, op, dtype, change):
    if algo == 2 and (dtype == 0 or change.get("group_size") == 8 and op != 2):
        pytest.skip("no grouped cubin for this case")
    if op == 1 and "bias" in change:
        pytest.skip("the gated op has no bias")
    kw = dict(_ALIGNED, **change, dtype=dtype, algo=algo)
    if op == 2:  # gemm_k groups K: keep K a multiple of the group size
        kw["K"], kw["N"] = kw["N"], kw["K"]
    if op == 1:
        kw["w2"] = 0x6000
    ws = 0x10000
    status, text = _describe(kernels_lib, op, ws=ws, ws_size=1 << 30, **kw)
    assert status == 0, text
    launches = [t for t in text.split() if "@" in t]
    gemm = [t for t in launches if not t.startswith(("group_rows@", "cast/"))]
    assert len(gemm) == 1, text
    want = "a16" if _want_a16(kw, algo, op, ws) else "any"
    assert gemm[0].endswith("@" + want), (text, kw)
    assert all(not t.startswith("group_rows@") or t.endswith("@any") for t in launches)  # nothing to align


def test_describe_shows_the_whole_grouped_k_plan(kernels_lib):
    kw = dict(M=300, N=256, K=384, group_size=128, x=0x1000, w=0x2000, mask=0x3000, y=0x4000, dtype=2, algo=2)
    status, text = _describe(kernels_lib, 2, ws=0x10000, ws_size=1 << 30, **kw)
    assert status == 0
    steps = text.split(" grid=")
    names = [s.split()[-1] for s in steps[:-1]]
    assert [n.split("@")[0] for n in names] == ["group_rows", "grouped_k/bfloat16", "cast/bfloat16"], text
    assert "memset " in text
    assert _describe(kernels_lib, 2, ws=None, ws_size=0, **kw)[0] == 3  # workspace too small, as the launch says
    assert _describe(kernels_lib, 7, **kw)[0] == 1


@pytest.mark.parametrize("op", [0, 1, 2])
def test_dense_algo_is_cublaslt_and_a_mask_pass(kernels_lib, op):
    kw = dict(M=300, N=384, K=256, group_size=32, x=0x1000, w=0x2000, mask=0x3000, y=0x4000, dtype=2, algo=4,
              bias=None if op == 1 else 0x5000, w2=0x6000 if op == 1 else None)
    if op == 2:
        kw["N"], kw["K"] = 256, 384
    p = _params(**kw)
    ws_size = kernels_lib.wide_gemm_workspace_size(ctypes.byref(p))
    status, text = _describe(kernels_lib, op, ws=0x10000, ws_size=ws_size, **kw)
    if not kernels_lib.wide_kernels_has_cublaslt():
        assert status == 5  # WIDE_ERR_NO_KERNEL: this build has no cuBLASLt, and says so
        assert b"cuBLASLt" in kernels_lib.wide_last_cuda_error_string()
        return
    assert status == 0, text
    M, N, K = kw["M"], kw["N"], kw["K"]
    mask_pass = {0: "apply_mask/bfloat16/plain", 1: "apply_mask/bfloat16/gated", 2: "apply_mask/bfloat16/plain"}[op]
    grid = f"grid={-(-M // configs.APPLY_MASK_BLOCK_M)}x{-(-(K if op == 2 else N) // configs.APPLY_MASK_BLOCK_N)}x1"
    want = {0: f"cublasLt+bias {M}x{N}x{K} {mask_pass}@a16 {grid}",
            1: f"cublasLt {M}x{N}x{K} cublasLt {M}x{N}x{K} {mask_pass}@a16 {grid}",
            2: f"{mask_pass}@a16 {grid} cublasLt+bias {M}x{N}x{K}"}[op]
    assert text == want
    # cuBLASLt's 32 MiB scratch (+ the masked x / the up projection) is part of the workspace
    assert _describe(kernels_lib, op, ws=0x10000, ws_size=(32 << 20) - 1, **kw)[0] == 3
    assert kernels_lib.wide_gemm_resolve_algo(ctypes.byref(_params(M=4096, N=4096, K=4096, group_size=32)), 0, 90) == 4


# Tiles of each size class, counted by hand: (BLOCK_M, BLOCK_N) per family (grouped: a group of 128, so the
# grouped BLOCK_N is 128) for small, large, wide (configs.py: 64-row tiles, 128 x 128 (gated 128 x 64), 128 x 256).
HAND_TILES = {"tile_n": {"small": (64, 64), "large": (128, 128), "wide": (128, 256)},
              "tile_gated": {"small": (64, 64), "large": (128, 64)},
              "tile_k": {"small": (64, 64), "large": (128, 128), "wide": (128, 256)},
              "grouped_n": {"small": (64, 128), "large": (128, 128)},
              "grouped_gated": {"small": (64, 128), "large": (128, 64)}}


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("dtype, dtype_name", [(2, "bfloat16"), (1, "float16"), (0, "float32")])
@pytest.mark.parametrize("aligned", [True, False])
def test_c_runtime_takes_each_size_class_from_the_policy_buckets(kernels_lib, arch, dtype, dtype_name, aligned):
    """At each prefill_tiles bucket boundary of policy.json (M = min_m - 1, min_m, min_m + 1) the prefill GEMMs
    launch the bucket's size class where this build has it (large / wide: fp16 / bf16 on sm_90; wide: a16
    only, so an unaligned call (an ungrouped dimension of 264 / 520) steps down to large), with the grid
    counted by hand from HAND_TILES; the JIT path (configs.size_for over policy.tile_size) makes the same
    choice."""
    from wide_export.kernels.policy import policy_for, tile_size

    pol = policy_for(f"sm_{arch}")
    gs = 128
    cases = [(0, 3, "tile_n", f"tile_n/{dtype_name}/plain"), (1, 3, "tile_gated", f"tile_n/{dtype_name}/gated"),
             (2, 3, "tile_k", f"tile_k/{dtype_name}")]
    if dtype != 0:  # no grouped cubins in float32
        cases += [(0, 2, "grouped_n", f"grouped_n/{dtype_name}/plain/bn128"),
                  (1, 2, "grouped_gated", f"grouped_n/{dtype_name}/gated/bn128")]
    fast = arch == 90 and dtype != 0  # this build has large / wide cubins for the call
    reached = set()
    for op, algo, fam, base in cases:
        for min_m, _ in pol["prefill_tiles"][fam]:
            for M in sorted({max(1, min_m - 1), max(1, min_m), min_m + 1}):
                # unaligned: the ungrouped dimension + 8 (gemm_k: K grouped, N = 512 (+ 8) outputs)
                K = 512 if op == 2 else 256 + (0 if aligned else 8)
                N = 512 + (8 if op == 2 and not aligned else 0)
                kw = dict(M=M, N=N, K=K, group_size=gs, x=0x1000, w=0x2000, mask=0x3000, y=0x4000, dtype=dtype,
                          algo=algo, w2=0x6000 if op == 1 else None)
                status, text = _describe(kernels_lib, op, arch=arch, ws=0x10000, ws_size=1 << 30, **kw)
                assert status == 0, text
                words = text.split(" ")
                gemm = next(i for i, t in enumerate(words) if t.startswith(("tile_", "grouped_n")))
                asked = tile_size(fam, M, pol)
                size = "small" if not fast else ("large" if asked == "wide" and not aligned else asked)
                bm, bn = HAND_TILES[fam][size]
                key = base if size == "small" else (base.replace("/bn128", "/bn64") if fam == "grouped_gated"
                                                    else base) + f"/{size}"
                want = f"{key}@{'a16' if aligned else 'any'} grid={-(-M // bm)}x{-(-N // bn)}x1"
                assert f"{words[gemm]} {words[gemm + 1]}" == want, (fam, M, text)
                assert configs.size_for(fam, asked, f"sm_{arch}", dtype_name, aligned) == size, (fam, M)
                reached.add(size)
    # every class the table asks for was reached where the build has it (the repository's default: all three)
    asked_for = {z for b in pol["prefill_tiles"].values() for _, z in b}
    if fast:
        assert reached == {z if aligned or z != "wide" else "large" for z in asked_for}
    else:
        assert reached == {"small"}


def test_variants_share_the_grid_the_c_runtime_computes():
    """Both variants of a key have the BLOCK_M / BLOCK_N the C runtime's grid assumes (HAND_TILES); only
    BLOCK_K / warps differ; the wide keys have the a16 variant only."""
    by_key = {}
    for s in aot.specs():
        by_key.setdefault(s.key, []).append(s)
    for key, group in by_key.items():
        blocks = {tuple(v for k, v in s.constexprs if k in ("BLOCK_M", "BLOCK_N")) for s in group}
        assert len(blocks) == 1, key
        if key.split("/")[0] in aot.GEMMS:
            want = ["a16"] if key.endswith("/wide") else ["a16", "any"]
            assert sorted(s.variant for s in group) == want, key
        gated = "/gated" in key
        fam = {"tile_n": "tile_gated" if gated else "tile_n", "tile_k": "tile_k",
               "grouped_n": "grouped_gated" if gated else "grouped_n"}.get(key.split("/")[0])
        if fam and (fam.startswith("tile") or "/bn128" in key or (gated and "/bn64/large" in key)):
            size = key.rsplit("/", 1)[1] if key.endswith(("/large", "/wide")) else "small"
            assert blocks == {HAND_TILES[fam][size]}, key


WS = 1 << 30  # a workspace "pointer" for the plans (never dereferenced)


@pytest.mark.parametrize("changes, arch, plan", [
    (dict(), 90, "masked_attention/float16/d128@a16 grid=2x64x1"),       # Llama-like prefill, 100 tokens
    # decode over a past: 65 key tiles, 16 wanted splits of 5 tiles -> 13, combined by the reduction
    (dict(T=1, S=4097, dtype=2), 80, "masked_decode/bfloat16/d128/split@a16 grid=2x8x13 "
                                     "attention_reduce/bfloat16/d128@a16 grid=64x1x1"),
    (dict(T=1, S=4097, dtype=2, B=64), 90, "masked_decode/bfloat16/d128@a16 grid=64x8x1"),  # 512 programs: no split
    (dict(T=1, S=100, Hk=1), 90, "masked_attention/float16/d128@a16 grid=1x64x1"),  # GQA 32 > the decode tile's 16
    (dict(D=64, dtype=0, B=3), 90, "masked_attention/float32/d64@a16 grid=2x96x1"),
    (dict(D=80), 90, "masked_attention/float16/d128@a16 grid=2x64x1"),   # 80: the d128 cubin, rows still 16-aligned
    (dict(allowed=0x4001), 90, "masked_attention/float16/d128@none grid=2x64x1"),  # misaligned: a16 cubins only
    (dict(D=72, T=1), 90, "masked_decode/float16/d128/split@any grid=2x8x2 "  # decode has both variants
                          "attention_reduce/float16/d128@any grid=64x1x1"),
])
def test_c_attention_plan_picks_the_head_size_class_and_variant(kernels_lib, changes, arch, plan):
    if arch not in _archs():
        pytest.skip(f"sm_{arch} not in this build's architectures")
    buf = ctypes.create_string_buffer(256)
    assert kernels_lib.wide_masked_attention_describe(ctypes.byref(_attention(**changes)), arch, ctypes.c_void_p(WS),
                                                     ctypes.c_size_t(WS), buf, ctypes.c_size_t(len(buf))) == 0
    assert buf.value.decode() == plan


def test_c_decode_attention_splits_as_python_plans_and_its_workspace_covers_every_call(kernels_lib):
    """The C decode plan splits the keys as kernels/attention.plan_splits does; the workspace size for the
    largest B and S covers the float32 partials of every smaller call; too small a workspace runs one split."""
    from wide_export.kernels.attention import plan_splits

    buf = ctypes.create_string_buffer(256)

    def plan(ws_size, **kw):
        assert kernels_lib.wide_masked_attention_describe(ctypes.byref(_attention(T=1, **kw)), 90, ctypes.c_void_p(WS),
                                                         ctypes.c_size_t(ws_size), buf, ctypes.c_size_t(len(buf))) == 0
        return buf.value.decode()

    def partials(b, S, Hq=32, D=128, Hk=8):
        splits = plan_splits(b, Hk, S)[0]
        rows = splits * b * Hq
        return 0 if splits == 1 else -(-rows * D * 4 // 256) * 256 + 2 * (-(-rows * 4 // 256) * 256)

    for S in (64, 1000, 4097, 32768):
        for B in (1, 3, 16, 40):
            want = plan_splits(B, 8, S)[0]
            assert f"grid={B}x8x{want} " in plan(WS, B=B, S=S) + " "
            size = kernels_lib.wide_masked_attention_workspace_size(ctypes.byref(_attention(T=1, B=B, S=S)))
            assert size == max(partials(b, S) for b in range(1, B + 1))
            assert all(partials(b, s) <= size for b in range(1, B + 1) for s in (1, S // 2, S))
    assert plan(partials(2, 4097) - 1, B=2, S=4097) == "masked_decode/float16/d128@a16 grid=2x8x1"
    assert kernels_lib.wide_masked_attention_workspace_size(ctypes.byref(_attention(T=5, S=4097))) == 0
    sizes_only = _attention(T=1, B=3, S=4097, q=None, k=None, v=None, allowed=None, head_mask=None, y=None)
    assert kernels_lib.wide_masked_attention_workspace_size(ctypes.byref(sizes_only)) == max(
        partials(b, 4097) for b in (1, 2, 3))  # sizes only: what the plugin asks when the engine is built


@pytest.mark.parametrize("changes, status", [
    (dict(D=160), 1),                 # over the largest head-size class
    (dict(D=72), 1),                  # prefill: head sizes a multiple of 16 (a16 cubins only)
    (dict(Hk=5), 1),                  # Hq % Hk
    (dict(group_heads=5), 1),         # Hq % group_heads
    (dict(S=99), 1),                  # fewer keys than queries
    (dict(allowed=None), 1),          # NULL input
    (dict(head_mask=None), 1),
    (dict(T=0), 1),
    (dict(B=4096), 1),                # B * Hq programs past the grid's y limit
    (dict(dtype=7), 2),               # unknown dtype
])
def test_c_attention_rejects_bad_arguments_before_touching_cuda(kernels_lib, changes, status):
    assert kernels_lib.wide_masked_attention(ctypes.byref(_attention(**changes)), None, ctypes.c_size_t(0), None) == status


def test_c_tiles_match_python_configs():
    """plugins/kernels/src/wide_kernels.cpp restates configs.py's tiles: they must agree."""
    from wide_export.native.build import SOURCE_DIR

    src = (SOURCE_DIR / "kernels" / "src" / "wide_kernels.cpp").read_text()

    def const(name):
        return int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))

    def arr(name):
        return tuple(int(v) for v in re.search(rf"constexpr int {name}\[\] = \{{([^}}]*)\}}", src).group(1).split(","))

    assert (const("kGemvBlockN"), const("kGemvBlockK")) == (configs.GEMV_BLOCK_N, configs.GEMV_BLOCK_K)
    assert (const("kGemvKBlockN"), const("kGemvKBlockK")) == (configs.GEMV_K_BLOCK_N, configs.GEMV_K_BLOCK_K)
    assert (const("kDecodeSms"), const("kDecodeTargetWaves")) == (configs.DECODE_SMS, configs.DECODE_TARGET_WAVES)
    assert const("kSplitkReduceBlock") == configs.SPLITK_REDUCE_BLOCK
    assert (const("kRouterSplitMaxM"), const("kRouterSplitBlockM"), const("kRouterSplitBlockR"),
            const("kRouterSplitBlockH")) == (configs.ROUTER_SPLIT_MAX_M, configs.ROUTER_SPLIT_BLOCK_M,
                                             configs.ROUTER_SPLIT_BLOCK_R, configs.ROUTER_SPLIT_BLOCK_H)
    assert const("kRouterBlockM") == configs.ROUTER_BLOCK_M
    assert arr("kRouterBlockRs") == configs.ROUTER_BLOCK_RS
    assert const("kCastBlock") == configs.CAST_BLOCK
    assert (const("kTileBlockM"), const("kTileBlockN")) == (configs.TILE_BLOCK_M, configs.TILE_BLOCK_N)
    assert (const("kLargeBlockM"), const("kLargeTileBlockN"), const("kLargeGatedBlockN")) == (
        configs.LARGE_BLOCK_M, configs.LARGE_TILE_BLOCK_N, configs.LARGE_GATED_BLOCK_N)
    assert (const("kWideBlockM"), const("kWideBlockN")) == (configs.WIDE_BLOCK_M, configs.WIDE_BLOCK_N)
    from wide_export.kernels.policy import MAX_TILE_BUCKETS

    assert const("kMaxTileBuckets") == MAX_TILE_BUCKETS
    suffixes = re.search(r"kSizeSuffix\[\] = \{([^}]*)\}", src).group(1)
    assert [v.strip().strip('"') for v in suffixes.split(",")] == ["" if z == "small" else f"/{z}"
                                                                    for z in configs.SIZES]
    families = re.findall(r"kFam(\w+) = (\d+),", src)
    assert [re.sub(r"(?<!^)([A-Z])", r"_\1", n).lower() for n, _ in families] == list(configs.TILE_FAMILIES)
    assert [int(i) for _, i in families] == list(range(len(configs.TILE_FAMILIES)))
    assert const("kGroupedBlockM") == configs.GROUPED_BLOCK_M
    assert arr("kGroupedBlockNs") == configs.GROUPED_BLOCK_NS
    assert const("kGroupedKBlockN") == configs.GROUPED_K_BLOCK_N
    assert (const("kApplyMaskBlockM"), const("kApplyMaskBlockN")) == (configs.APPLY_MASK_BLOCK_M,
                                                                      configs.APPLY_MASK_BLOCK_N)
    assert const("kAttnBlockM") == configs.ATTENTION_BLOCK_M
    assert arr("kAttnBlockDs") == configs.ATTENTION_BLOCK_DS
    assert (const("kAttnDecodeBlockH"), const("kAttnDecodeBlockL"), const("kAttnMaxSplits"),
            const("kAttnTargetPrograms")) == (configs.ATTENTION_DECODE_BLOCK_H, configs.ATTENTION_DECODE_BLOCK_L,
                                              configs.ATTENTION_MAX_SPLITS, configs.ATTENTION_TARGET_PROGRAMS)
    from wide_export.kernels import attention

    assert (attention.BLOCK_L, attention.MAX_SPLITS, attention.SPLIT_TARGET_PROGRAMS) == (
        configs.ATTENTION_DECODE_BLOCK_L, configs.ATTENTION_MAX_SPLITS, configs.ATTENTION_TARGET_PROGRAMS)


def test_policy_table_is_complete():
    from wide_export.kernels.policy import POLICY_FILE

    table = json.loads(POLICY_FILE.read_text())
    keys = {"measured", "gemv_max_m", "grouped_n_min_m", "grouped_n_min_group_size", "grouped_k_min_m",
            "grouped_k_min_group_size", "prefill_tiles", "fallback"}
    for arch, entry in table.items():
        if not arch.startswith("_"):
            assert keys <= set(entry), arch


@pytest.mark.parametrize("given, cmake", [("80,90", "80;90"), ("sm_80 sm_90", "80;90"), ("90a", "90a"),
                                          (None, "80;86;89;90")])
def test_arch_lists_are_normalized(given, cmake):
    assert normalize_archs(given) == cmake


def test_bad_arch_is_a_user_error():
    with pytest.raises(WideError, match="architecture"):
        normalize_archs("ampere")


def test_configure_passes_tensorrt_locations_and_python(tmp_path):
    import sys

    cmd = configure_command(tmp_path / "b", "90", tensorrt_root=tmp_path, tensorrt_include_dir=tmp_path / "inc",
                            tensorrt_lib_dir=tmp_path / "lib", nvcc="/x/nvcc")
    joined = " ".join(cmd)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in joined
    assert f"-DTENSORRT_ROOT={tmp_path.resolve()}" in joined
    assert f"-DTENSORRT_INCLUDE_DIR={(tmp_path / 'inc').resolve()}" in joined
    assert f"-DTENSORRT_LIB_DIR={(tmp_path / 'lib').resolve()}" in joined
    assert "-DCMAKE_CUDA_COMPILER=/x/nvcc" in joined
    assert f"-DWIDE_PYTHON={sys.executable}" in joined


# ---------------------------------------------------------------------------
# The plugins' path on a GPU: the AOT cubins launched by the C runtime, against the references.
def _ptr(t):
    return None if t is None else t.data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_code,dtype_name", [(1, "float16"), (2, "bfloat16"), (0, "float32")])
@pytest.mark.parametrize("algo", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["n", "n_bias", "gated", "k"])
@pytest.mark.parametrize("M", [1, 5, 300, 1100, 4100])
def test_c_library_runs_the_aot_kernels_on_gpu(kernels_lib, kind, algo, dtype_code, dtype_name, M):
    import torch

    from wide_export.ops import reference as ref

    if M == 1100 and (algo not in (2, 3) or dtype_code == 0):
        pytest.skip("1100 rows: for the 128-row '/large' prefill cubins (grouped, tile; fp16 / bf16)")
    if M == 4100 and (algo != 3 or dtype_code == 0 or kind == "gated"):
        pytest.skip("4100 rows: for the 128 x 256 '/wide' tile cubins (default policy; tile_n / tile_k)")
    if M == 4100:  # the size class this GPU's policy entry gives (its own, its architecture's, the default)
        from wide_export.kernels.policy import policy_for, tile_size

        major, minor = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
        fam = "tile_k" if kind == "k" else "tile_n"
        size = configs.size_for(fam, tile_size(fam, M, policy_for(f"sm_{major}{minor}", name)),
                                f"sm_{major}{minor}", dtype_name, True)
    if algo == 2 and dtype_code == 0:
        pytest.skip("no grouped cubins for float32 (tile runs float32 prefill)")
    if algo == 4 and not kernels_lib.wide_kernels_has_cublaslt():
        pytest.skip("this build has no cuBLASLt dense path (configure with WIDE_CUBLAS_ROOT)")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(M * 10 + algo)
    gs, G, other = 128, 6, 320
    N, K = (other, G * gs) if kind == "k" else (G * gs, other)
    x = torch.randn(M, K, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=gen) / K**0.5).to(dtype)
    w2 = (torch.randn(N, K, device="cuda", generator=gen) / K**0.5).to(dtype) if kind == "gated" else None
    b = torch.randn(N, device="cuda", generator=gen).to(dtype) if kind == "n_bias" else None
    mask = (torch.rand(M, G, device="cuda", generator=gen) < 0.5).to(torch.int32)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    p = GemmParams(M=M, N=N, K=K, group_size=gs, x=_ptr(x), w=_ptr(w), w2=_ptr(w2), bias=_ptr(b), mask=_ptr(mask),
                   y=_ptr(y), dtype=dtype_code, algo=algo)
    ws = torch.empty(kernels_lib.wide_gemm_workspace_size(ctypes.byref(p)), dtype=torch.uint8, device="cuda")
    fn = {"n": "wide_gemm_n", "n_bias": "wide_gemm_n", "gated": "wide_gemm_n_gated", "k": "wide_gemm_k"}[kind]
    if M == 4100:  # what the launch below runs: that size class's cubin
        buf = ctypes.create_string_buffer(512)
        op = {"n": 0, "n_bias": 0, "k": 2}[kind]
        assert kernels_lib.wide_gemm_describe_device(ctypes.byref(p), op, major * 10 + minor, name.encode(),
                                                     ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel()),
                                                     buf, ctypes.c_size_t(len(buf))) == 0
        key = buf.value.decode().split("@")[0]
        assert key.endswith(("/large", "/wide")) == (size != "small") and key.endswith(
            "" if size == "small" else f"/{size}"), (key, size)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    status = getattr(kernels_lib, fn)(ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel()),
                                      stream)
    assert status == 0, kernels_lib.wide_last_cuda_error_string()
    torch.cuda.synchronize()
    if kind == "k":
        want = ref.masked_gemm_k(x, w, mask, gs)
    elif kind == "gated":
        want = ref.masked_gated_mlp(x, w, w2, mask, gs)
    else:
        want = ref.masked_gemm_n(x, w, mask, gs, b)
    err = (y.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())
    assert err <= {0: 2e-5, 1: 4e-3, 2: 2.5e-2}[dtype_code], err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_code,dtype_name", [(1, "float16"), (2, "bfloat16"), (0, "float32")])
@pytest.mark.parametrize("B,Hq,Hk,T,S,D,gh,pad", [
    (2, 32, 8, 300, 300, 128, 4, 70),     # prefill, a row left-padded past a whole tile
    (4, 32, 8, 1, 2049, 128, 4, 5),       # decode over a past
    (1, 16, 16, 77, 200, 64, 2, 0),       # chunked prefill, no GQA, head size 64
])
def test_c_masked_attention_on_gpu(kernels_lib, dtype_code, dtype_name, B, Hq, Hk, T, S, D, gh, pad):
    import torch

    from wide_export.ops import reference as ref

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(B * T + S)
    q = torch.randn(B, Hq, T, D, device="cuda", generator=gen).to(dtype)
    k = torch.randn(B, Hk, S, D, device="cuda", generator=gen).to(dtype)
    v = torch.randn(B, Hk, S, D, device="cuda", generator=gen).to(dtype)
    causal = torch.arange(S, device="cuda")[None, :] <= (S - T + torch.arange(T, device="cuda"))[:, None]
    keys = torch.ones(B, S, dtype=torch.bool, device="cuda")
    keys[0, :pad] = False
    allowed = causal[None, None] & keys[:, None, None, :]
    mask = (torch.rand(B, T, Hq // gh, device="cuda", generator=gen) < 0.5).to(torch.int32)
    y = torch.full((B, Hq, T, D), float("nan"), device="cuda", dtype=dtype)
    p = AttentionParams(B=B, Hq=Hq, Hk=Hk, T=T, S=S, D=D, group_heads=gh, q=_ptr(q), k=_ptr(k), v=_ptr(v),
                        allowed=_ptr(allowed), head_mask=_ptr(mask), y=_ptr(y), dtype=dtype_code)
    ws = torch.empty(kernels_lib.wide_masked_attention_workspace_size(ctypes.byref(p)), dtype=torch.uint8, device="cuda")
    status = kernels_lib.wide_masked_attention(ctypes.byref(p), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel()),
                                               ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    assert status == 0, kernels_lib.wide_last_cuda_error_string()
    torch.cuda.synchronize()
    want = ref.wide_masked_attention(q, k, v, allowed, mask, gh)
    err = (y.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())
    assert err <= {0: 2e-5, 1: 4e-3, 2: 3e-2}[dtype_code], err
    off = ~mask.bool().repeat_interleave(gh, dim=-1).transpose(1, 2)
    assert torch.equal(y[off], torch.zeros_like(y[off]))


@pytest.mark.gpu
@pytest.mark.parametrize("M", (77, 3))  # the one-pass router, the split one (decode, workspace)
@pytest.mark.parametrize("dtype_code,dtype_name", [(1, "float16"), (0, "float32")])
def test_c_router_on_gpu(kernels_lib, dtype_code, dtype_name, M):
    import torch

    from wide_export.ops import reference as ref

    gen = torch.Generator(device="cuda").manual_seed(5)
    H, R, G = 512, 96, 10
    x = torch.randn(M, H, device="cuda", generator=gen).to(getattr(torch, dtype_name))
    wc = torch.randn(R, H, device="cuda", generator=gen) / H**0.5
    bc = torch.randn(R, device="cuda", generator=gen) * 0.1
    wr = torch.randn(2 * G, R, device="cuda", generator=gen) / R**0.5
    br = torch.randn(2 * G, device="cuda", generator=gen) * 0.1
    mask = torch.full((M, G), -1, dtype=torch.int32, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    kernels_lib.wide_router_workspace_size.restype = ctypes.c_size_t
    nws = kernels_lib.wide_router_workspace_size(ctypes.c_int64(M), ctypes.c_int64(H), ctypes.c_int64(R))
    ws = torch.empty(max(nws, 1), dtype=torch.uint8, device="cuda")
    status = kernels_lib.wide_router_ws(ctypes.c_void_p(x.data_ptr()), dtype_code, ctypes.c_int64(M),
                                        ctypes.c_int64(H), *(ctypes.c_void_p(t.data_ptr()) for t in (wc, bc)),
                                        ctypes.c_int64(R), *(ctypes.c_void_p(t.data_ptr()) for t in (wr, br)),
                                        ctypes.c_int64(G), ctypes.c_void_p(mask.data_ptr()),
                                        ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(nws), stream)
    assert status == 0, kernels_lib.wide_last_cuda_error_string()
    torch.cuda.synchronize()
    logits = ref.router_logits(x, wc, bc, wr, br)
    clear = (logits[..., 0] - logits[..., 1]).abs() > 1e-3
    assert torch.equal(mask[clear], ref.wide_router(x, wc, bc, wr, br)[clear])


@pytest.mark.parametrize("offset, K", [(0, 256), (1, 256), (0, 264), (0, 250)])
def test_jit_tile_follows_the_runtime_variant_choice(kernels_lib, offset, K):
    """launch.py picks the a16 tile exactly when the C runtime would launch the a16 cubin for those tensors."""
    import torch

    from wide_export.kernels import launch

    M, N, gs = 40, 96, 16
    x = torch.zeros(M * K + 8, dtype=torch.float16)[offset:offset + M * K].view(M, K)
    w = torch.zeros(N, K, dtype=torch.float16)
    mask = torch.zeros(M, N // gs, dtype=torch.int32)
    y = torch.zeros(M, N, dtype=torch.float16)
    jit = launch._aligned(x, w, None, None, mask, y, ints=(N, K, gs))
    status, text = _describe(kernels_lib, 0, M=M, N=N, K=K, group_size=gs, x=x.data_ptr(), w=w.data_ptr(),
                             mask=mask.data_ptr(), y=y.data_ptr(), dtype=1, algo=3)
    assert status == 0
    assert text.split()[0] == "tile_n/float16/plain@" + ("a16" if jit else "any")
    assert jit == (offset == 0 and K % 16 == 0)
    t = configs.tile_tile("float16", aligned=jit)
    assert t.block_k == (configs.TILE_BLOCK_K if jit else configs.UNALIGNED_BLOCK_K)


# ---------------------------------------------------------------------------
# One GPU model's own policy entry ("sm_90@NVIDIA H200"), in the C runtime: wide_kernels.cpp compiled again here
# against a hand-written policy table (the build's cubins and table, only wide_aot_policy.inc replaced).
def _lib_with_policy(kernels_build, table: dict, tmp_path):
    import shlex
    import shutil
    import subprocess

    build = kernels_build.build_dir
    if not (build / "build.ninja").is_file() or not shutil.which("ninja"):
        pytest.skip("needs a Ninja build of plugins/kernels (its compile command is read from ninja)")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "wide_aot_policy.inc").write_text(aot._policy_inc(table))
    cmds = subprocess.run(["ninja", "-C", str(build), "-t", "commands", "wide_kernels"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    compile_cmd = shlex.split(next(c for c in cmds if "-c " in c and "wide_kernels.cpp" in c))
    link_cmd = next(c for c in cmds if "-shared" in c).removeprefix(": && ").removesuffix(" && :")
    obj = tmp_path / "wide_kernels.o"
    out, skip = [], False
    for a in compile_cmd:
        if skip:
            skip = False
        elif a in ("-MT", "-MF", "-o"):
            skip = True
        elif a != "-MD":
            out.append({"-O3": "-O0"}.get(a, a))
    aot_dir = next(a for a in out if a.startswith("-I") and a.endswith("/aot"))
    out.insert(out.index(aot_dir), f"-I{inc}")  # searched first: the hand policy, the build's cubin table
    subprocess.run(out + ["-o", str(obj)], cwd=build, check=True, capture_output=True)
    link = shlex.split(link_cmd)
    so = tmp_path / "libwide_kernels_policy.so"
    link[link.index("-o") + 1] = str(so)
    link = [str(obj) if a.endswith("wide_kernels.cpp.o") else a for a in link]
    subprocess.run(link, cwd=build, check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def test_c_runtime_takes_a_gpu_models_own_policy_entry(kernels_build, tmp_path, monkeypatch):
    """Hand table: the default, an sm_90 entry (GEMV up to 4 / 5 / 6 rows for n / gated / k) and an H200 one
    (8 / 9 / 10 rows; 128-row tiles from row 0 for tile_n and the grouped gated GEMM, not for grouped_n). The
    H200 entry serves a device of that name only; another sm_90 (an H100) and a call that names no device
    take sm_90's; sm_80 takes the default; policy.policy_for picks the same entries. Distinct values per
    kind and family: a field of wide_aot_policy.inc written into its neighbour's place fails here."""
    from wide_export.kernels import policy

    base = json.loads(policy.POLICY_FILE.read_text())
    default = base["default"]
    table = {"default": default,
             "sm_90": dict(default, measured=True, gemv_max_m={"n": 4, "gated": 5, "k": 6}),
             "sm_90@NVIDIA H200": dict(default, measured=True, device="NVIDIA H200",
                                       gemv_max_m={"n": 8, "gated": 9, "k": 10}, fallback="tile",
                                       prefill_tiles={**default["prefill_tiles"], "tile_n": [[0, "large"]],
                                                      "grouped_gated": [[0, "large"]]})}
    assert policy.validate(table) == []
    lib = _lib_with_policy(kernels_build, table, tmp_path)

    def launches(M, arch, device, algo=0, op=0):
        p = _params(M=M, N=512, K=256 if op != 2 else 512, group_size=128, dtype=2, algo=algo,
                    w2=0x6000 if op == 1 else None)
        buf = ctypes.create_string_buffer(512)
        status = lib.wide_gemm_describe_device(ctypes.byref(p), op, arch, device, ctypes.c_void_p(0x10000),
                                               ctypes.c_size_t(1 << 30), buf, ctypes.c_size_t(len(buf)))
        assert status == 0, (M, arch, device, buf.value)
        return [w for w in buf.value.decode().split(" ") if "@" in w]

    def first(M, arch, device, algo=0):
        return launches(M, arch, device, algo)[0]

    h200, h100 = b"NVIDIA H200", b"NVIDIA H100 80GB HBM3"
    assert first(8, 90, h200) == "gemv_n/bfloat16/plain@a16"           # the H200's GEMV range
    assert first(9, 90, h200) == "tile_n/bfloat16/plain/large@a16"      # its fallback, its tiles from row 0
    assert first(4, 90, h100) == "gemv_n/bfloat16/plain@a16"            # sm_90's range ...
    assert first(5, 90, h100) != "gemv_n/bfloat16/plain@a16"            # ... ends at 4
    assert first(5, 90, None) == first(5, 90, h100) == first(5, 90, b"")  # no name: the architecture's entry
    assert first(3, 80, h200) == first(3, 80, None) != "gemv_n/bfloat16/plain@a16"  # sm_80: the default (2)
    assert first(100, 90, h100, algo=3) == "tile_n/bfloat16/plain@a16"  # sm_90's tiles: small under 1024 rows
    for device, gated_max, k_max in ((h200, 9, 10), (h100, 5, 6)):  # per kind, per entry
        assert launches(gated_max, 90, device, op=1)[0] == "gemv_n/bfloat16/gated@a16"
        assert launches(gated_max + 1, 90, device, op=1)[0] != "gemv_n/bfloat16/gated@a16"
        assert launches(k_max, 90, device, op=2)[0] == "gemv_k/bfloat16@a16"
        assert launches(k_max + 1, 90, device, op=2)[0] != "gemv_k/bfloat16@a16"
    # grouped at 300 rows: the H200's gated buckets say large from row 0, its grouped_n ones small until 1024
    assert launches(300, 90, h200, algo=2, op=1)[1] == "grouped_n/bfloat16/gated/bn64/large@a16"
    assert launches(300, 90, h200, algo=2, op=0)[1] == "grouped_n/bfloat16/plain/bn128@a16"
    assert launches(300, 90, h100, algo=2, op=1)[1] == "grouped_n/bfloat16/gated/bn128@a16"
    monkeypatch.setattr(policy, "_table", lambda: table)
    for arch, device, gemv, key in ((90, h200, 8, "sm_90@NVIDIA H200"), (90, h100, 4, "sm_90"),
                                    (90, None, 4, "sm_90"), (80, h200, 2, "default")):
        got = policy.policy_for(f"sm_{arch}", device.decode() if device else None)
        assert (got["gemv_max_m"]["n"], got["arch"]) == (gemv, key)
