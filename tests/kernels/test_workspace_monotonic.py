"""Workspace queries must not shrink as M grows (host-only C API, no GPU needed).

TensorRT allocates a plugin's workspace at the profile's maximum shape and then
runs every smaller shape in it, and the plugins hand the kernels the query for
the actual shape as the workspace size: a query that is larger for a smaller M
would let the kernels write past the allocation. The split-K (GEMM) and
H-slice (router) factors shrink as M grows, which is where this can go wrong.
"""

from __future__ import annotations

import ctypes

import pytest

from wide_export.native import kernels


def _gemm_ws(lib, M: int, N: int, K: int) -> int:
    p = kernels.GemmParams(M=M, N=N, K=K, group_size=N // 8, num_groups=8, x=0x1000, ldx=K, w=0x2000,
                           ldw=K, mask=0x3000, ldmask=8, y=0x4000, ldy=N, dtype=1, algo=0)
    return lib.wide_gemm_workspace_size(ctypes.byref(p))


@pytest.mark.parametrize("N, K", [(4096, 4096), (128, 16384), (14336, 4096), (4096, 14336)])
def test_gemm_workspace_is_monotonic_in_rows(kernels_lib_path, N, K):
    lib = kernels.load_library(kernels_lib_path)
    sizes = [_gemm_ws(lib, M, N, K) for M in range(1, 700)]
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))
    # a small M that splits K needs fp32 partials; a larger profile maximum must cover them
    assert _gemm_ws(lib, 4096, N, K) >= max(sizes)


@pytest.mark.parametrize("H, R", [(4096, 32), (2048, 16), (5120, 64)])
def test_router_workspace_is_monotonic_in_rows(kernels_lib_path, H, R):
    lib = kernels.load_library(kernels_lib_path)
    rows = list(range(1, 600)) + list(range(16800, 16900))  # around the H-slice count changes
    sizes = [lib.wide_router_workspace_size(M, H, R, 8) for M in rows]
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))
    assert all(s >= 4 * M * R for M, s in zip(rows, sizes))  # at least one slice of partial z
