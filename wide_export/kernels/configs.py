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

# Decode (gemv, router): many programs per GEMV (TEAL's split-K sparse GEMV, FasterDecoding/TEAL), planned
# by wide_export.kernels.launch.{gemv_n,gemv_k,router}_plan for the launching GPU's SM count.
DECODE_SMS = 132           # H200; the plans use the device's own count, this one on CPU and in the grid tests
DECODE_MIN_WAVES = 2       # every decode grid at Llama-3.1-8B shapes fills >= 2 waves (tests/kernels/test_decode_grid.py)
DECODE_TARGET_WAVES = 4    # K is split until the grid reaches this many waves (or one K chunk per split)

GEMV_BLOCK_N = 8           # gemv_n: output channels per program, the whole K in one program (no split)
GEMV_BLOCK_K = 256
GEMV_K_BLOCK_N = 32        # gemv_k: output channels per program
GEMV_K_BLOCK_K = 128       # gemv_k: K chunk; a split is a range of chunks
GEMV_WARPS = 4
SPLITK_REDUCE_BLOCK = 1024

ROUTER_BLOCK_M = 16        # the fused router (prefill): one program per 16 tokens
ROUTER_BLOCK_H = 64
ROUTER_BLOCK_G = 16
ROUTER_BLOCK_RS = (16, 32, 64, 128, 256)  # BLOCK_R >= R: the compressor output stays in registers
ROUTER_WARPS = 4
ROUTER_SPLIT_MAX_M = 64    # up to this many tokens the router runs split (router_split + router_logits)
ROUTER_SPLIT_BLOCK_M = 8
ROUTER_SPLIT_BLOCK_R = 8   # compressor rows per program
ROUTER_SPLIT_BLOCK_H = 16  # H chunk; a split is a range of chunks

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
