"""Tile shapes and launch settings of the Triton kernels, shared by the JIT path
(``wide_export.kernels.launch``) and the ahead-of-time build for the plugins
(``wide_export.kernels.aot``, mirrored in ``plugins/kernels/src/wide_kernels.cpp``).

They depend on the dtype and the group size only, never on M, so that one
cubin per (kernel, dtype, variant) serves every shape a TensorRT profile
allows. None of these was tuned on a GPU yet (see README, "Kernels").
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float16", "bfloat16", "float32")

GEMV_BLOCK_N = 16
GEMV_BLOCK_K = 256
GEMV_WARPS = 4

ROUTER_BLOCK_M = 16
ROUTER_BLOCK_H = 64
ROUTER_BLOCK_G = 16
ROUTER_BLOCK_RS = (16, 32, 64, 128, 256)  # BLOCK_R >= R: the compressor output stays in registers
ROUTER_WARPS = 4

GROUP_ROWS_BLOCK = 1024
CAST_BLOCK = 1024

TILE_BLOCK_M = 64
TILE_BLOCK_N = 64
TILE_BLOCK_K = 64
TILE_WARPS = 4
STAGES = 3

GROUPED_BLOCK_M = 64
GROUPED_BLOCK_NS = (128, 64, 32, 16)  # the widest that divides group_size is used
GROUPED_BLOCK_K = 64
GROUPED_K_BLOCK_N = 128


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = STAGES


def router_block_r(R: int) -> int:
    """Smallest supported BLOCK_R >= R; 0 when R is too large for the fused router."""
    for b in ROUTER_BLOCK_RS:
        if R <= b:
            return b
    return 0


def grouped_block_n(group_size: int) -> int:
    """Widest grouped-GEMM BLOCK_N dividing group_size (a tile must lie in one group); 0 if none."""
    for b in GROUPED_BLOCK_NS:
        if group_size % b == 0:
            return b
    return 0


def grouped_n_tile(group_size: int) -> Tile:
    bn = grouped_block_n(group_size)
    return Tile(GROUPED_BLOCK_M, bn, GROUPED_BLOCK_K, 8 if bn == 128 else 4)


def grouped_k_tile() -> Tile:
    return Tile(GROUPED_BLOCK_M, GROUPED_K_BLOCK_N, GROUPED_BLOCK_K, 8)


def tile_tile() -> Tile:
    return Tile(TILE_BLOCK_M, TILE_BLOCK_N, TILE_BLOCK_K, TILE_WARPS)
