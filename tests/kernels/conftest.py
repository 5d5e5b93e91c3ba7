"""Shared fixtures of the kernel tests: one CMake build of the kernel library per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wide_export.native.build import find_nvcc

TEST_ARCHS = os.environ.get("WIDE_KERNELS_TEST_ARCHS", "80;90")  # CI compiles sm_80 + sm_90


@pytest.fixture(scope="session")
def kernels_build(tmp_path_factory):
    """Build wide_kernels (+ static): the Triton AOT step for sm_80 and sm_90 plus the C API; skipped without nvcc.

    $WIDE_KERNELS_BUILD_DIR reuses a build folder (CI points it at the one
    `wide-export build` just made, so this is an incremental no-op there).
    """
    if find_nvcc() is None:
        pytest.skip("nvcc (CUDA compiler) not found: the kernel build cannot be tested here")
    from filelock import FileLock

    from wide_export.native.build import build_native

    build_dir = Path(os.environ.get("WIDE_KERNELS_BUILD_DIR") or tmp_path_factory.mktemp("native")).absolute()
    # pytest-xdist workers share $WIDE_KERNELS_BUILD_DIR: one CMake/ninja run in it at a time. The lock lies
    # beside the folder, not in it: build_native removes a folder it created when interrupted, and only knows
    # it created it when the folder did not exist before.
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build_dir.parent / f".{build_dir.name}.wide-tests-build.lock")):
        return build_native(build_dir=build_dir, cuda_archs=TEST_ARCHS,
                            targets=("wide_kernels", "wide_kernels_static"))


@pytest.fixture(scope="session")
def kernels_lib(kernels_build):
    import ctypes

    path = kernels_build.lib_dir / "libwide_kernels.so"
    assert path.is_file(), f"build did not produce {path}"
    lib = ctypes.CDLL(str(path))
    lib.wide_status_string.restype = ctypes.c_char_p
    lib.wide_last_cuda_error_string.restype = ctypes.c_char_p
    lib.wide_gemm_params_sizeof.restype = ctypes.c_size_t
    lib.wide_attention_params_sizeof.restype = ctypes.c_size_t
    lib.wide_masked_attention_workspace_size.restype = ctypes.c_size_t
    lib.wide_gemm_workspace_size.restype = ctypes.c_size_t
    return lib

