"""The CMake build of plugins/kernels and its C API, exercised without a GPU."""

from __future__ import annotations

import ctypes
import ctypes.util
import re

import pytest

from wide_export.errors import WideError
from wide_export.native import kernels
from wide_export.native.build import configure_command, normalize_archs

from .conftest import TEST_ARCHS


def test_build_compiles_for_sm80_and_sm90(kernels_build):
    names = {p.name for p in kernels_build.libraries}
    assert {"libwide_kernels.so", "libwide_kernels_static.a"} <= names
    cache = (kernels_build.build_dir / "CMakeCache.txt").read_text()
    assert re.search(rf"^CMAKE_CUDA_ARCHITECTURES:\w+={re.escape(TEST_ARCHS)}$", cache, re.M)
    # kernels/ compiles with warnings as errors; nothing of ours may even warn
    assert not re.search(r"kernels/src/\S+.*warning", kernels_build.log.read_text(), re.I)


def test_library_loads_and_reports_its_api(kernels_lib_path):
    lib = kernels.load_library(kernels_lib_path)  # checks version and struct size itself
    assert lib.wide_kernels_api_version() == kernels.API_VERSION
    assert lib.wide_gemm_params_sizeof() == ctypes.sizeof(kernels.GemmParams)
    assert lib.wide_status_string(0) == b"ok"
    assert b"workspace" in lib.wide_status_string(3)
    assert lib.wide_layout_ints(10, 4) == 4 + 40


def _params(**kw) -> kernels.GemmParams:
    """Valid-looking params with fake (never dereferenced) device pointers."""
    base = dict(M=16, N=64, K=32, group_size=16, num_groups=4, x=0x1000, ldx=32, w=0x2000, ldw=32,
                mask=0x3000, ldmask=4, y=0x4000, ldy=64, dtype=1, algo=0)
    base.update(kw)
    return kernels.GemmParams(**base)


@pytest.mark.parametrize(
    "fn, changes, status",
    [
        ("wide_gemm_n", dict(group_size=15), 1),         # N != G * gs
        ("wide_gemm_k", dict(), 1),                       # K != G * gs for gemm_k
        ("wide_gemm_n", dict(ldx=16), 1),                 # ldx < K
        ("wide_gemm_n", dict(ldmask=3), 1),               # ldmask < G
        ("wide_gemm_n", dict(x=None), 1),                 # NULL input
        ("wide_gemm_n", dict(w2=0x5000), 1),              # w2 only for the gated op
        ("wide_gemm_n_gated", dict(), 1),                 # gated without w2
        ("wide_gemm_k", dict(K=64, ldx=64, ldw=64, bias=0x6000), 1),  # bias only for gemm_n
        ("wide_gemm_n", dict(dtype=7), 2),                # unknown dtype
        ("wide_gemm_n", dict(algo=9), 1),                 # unknown algo
        ("wide_gemm_n", dict(), 3),                       # no workspace for a prefill-sized M
    ],
)
def test_c_api_rejects_bad_arguments_before_touching_cuda(kernels_lib_path, fn, changes, status):
    lib = kernels.load_library(kernels_lib_path)
    p = _params(**changes)
    assert getattr(lib, fn)(ctypes.byref(p), None, 0, None) == status


def test_c_api_empty_problem_and_workspace_query(kernels_lib_path):
    lib = kernels.load_library(kernels_lib_path)
    assert lib.wide_gemm_n(ctypes.byref(_params(M=0)), None, 0, None) == 0
    small = lib.wide_gemm_workspace_size(ctypes.byref(_params(M=16)))
    large = lib.wide_gemm_workspace_size(ctypes.byref(_params(M=4096)))
    assert 0 < small < large
    assert large >= 4 * (4 + 4 * 4096)  # covers the mask layout
    assert lib.wide_router_workspace_size(8, 64, 16, 4) >= 4 * 8 * 16  # fused path: partial z
    assert lib.wide_router_workspace_size(8, 64, 80, 4) >= 4 * (8 * 80 + 8 * 8)  # wide R: z + logits
    # router argument errors: ldx < H, then a missing workspace
    assert lib.wide_router(0x1000, 32, 1, 8, 64, 0x2000, 0x3000, 16, 0x4000, 0x5000, 4,
                           0x6000, 4, None, 0, None) == 1
    assert lib.wide_router(0x1000, 64, 1, 8, 64, 0x2000, 0x3000, 16, 0x4000, 0x5000, 4,
                           0x6000, 4, None, 0, None) == 3
    assert lib.wide_mask_layout(0x1000, 2, 8, 4, 0x2000, None) == 1  # ldmask < G


def test_missing_library_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv(kernels.LIB_ENV, str(tmp_path / "nope.so"))
    assert kernels.library_path() == tmp_path / "nope.so"
    with pytest.raises(WideError, match="not found") as info:
        kernels.load_library()
    assert "wide-export build" in str(info.value)


def test_unloadable_and_foreign_libraries_are_refused(tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(WideError, match="cannot load"):
        kernels.load_library(junk)
    ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    maps = open("/proc/self/maps").read().split()
    found = [p for p in maps if "/libm." in p or "/libm-" in p]
    if not found:
        pytest.skip("no libm on disk to stand in for a foreign library")
    path = found[0]
    with pytest.raises(WideError, match="not the wide kernel library"):
        kernels.load_library(path)


@pytest.mark.parametrize("given, cmake", [("80,90", "80;90"), ("sm_80 sm_90", "80;90"), ("90a", "90a"),
                                          (None, "80;86;89;90")])
def test_arch_lists_are_normalized(given, cmake):
    assert normalize_archs(given) == cmake


def test_bad_arch_is_a_user_error():
    with pytest.raises(WideError, match="architecture"):
        normalize_archs("ampere")


def test_configure_passes_tensorrt_locations(tmp_path):
    cmd = configure_command(tmp_path / "b", "90", tensorrt_root=tmp_path, tensorrt_include_dir=tmp_path / "inc",
                            tensorrt_lib_dir=tmp_path / "lib", nvcc="/x/nvcc")
    joined = " ".join(cmd)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in joined
    assert f"-DTENSORRT_ROOT={tmp_path.resolve()}" in joined
    assert f"-DTENSORRT_INCLUDE_DIR={(tmp_path / 'inc').resolve()}" in joined
    assert f"-DTENSORRT_LIB_DIR={(tmp_path / 'lib').resolve()}" in joined
    assert "-DCMAKE_CUDA_COMPILER=/x/nvcc" in joined
