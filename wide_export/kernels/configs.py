"""Tile shapes and launch settings of the Triton kernels, shared by the JIT path
(``wide_export.kernels.launch``) and the ahead-of-time build for the plugins
(``wide_export.kernels.aot``, mirrored in ``plugins/kernels/src/wide_kernels.cpp``).

They depend on the dtype, the group size and the alignment, and on M through
the size classes of the prefill GEMMs (SIZES: "small" 64-row tiles, "large"
128-row, "wide" 128 x 256). Which class serves which M is data: the policy's
``prefill_tiles`` buckets per GEMM family (TILE_FAMILIES), measured by
``bench kernels`` and recorded with ``--record``, as vLLM keeps its fused-MoE
configs per M. Every class is a cubin per key that the C runtime picks by the
same buckets, so every shape a TensorRT profile allows is served. None of the
tiles was tuned on a GPU yet (see README, "Kernels"); what they were chosen for
is checked without one: ``python -m wide_export.kernels.report`` (no cubin
spills, GEMM main loops pipelined, wgmma on sm_90;
tests/kernels/test_cubin_report.py).

Alignment: with pointers and dimensions multiples of 16 (the ``a16`` cubins,
what Triton's JIT specializes for such calls) the loads are 16-byte vectors
and cp.async pipelines them. Otherwise (``any``) every fp16 element is its own
load whose 64-bit address ptxas keeps in registers: a 64-deep K step then
spills (tile_k: 304 B, gated grouped bn64: 632 B on sm_90), a 16-deep one does
not. Only BLOCK_K and the warps change with the alignment, never BLOCK_M /
BLOCK_N, so the launch grid is the same for both. The one exception is "wide":
its ``any`` twin spilled (208-224 B on sm_90), so it has no ``any`` cubin and an
unaligned call steps down to "large" (``size_for``), in the JIT path and the C
runtime alike.
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
ROUTER_BLOCK_H = 64        # the fused router's H step for BLOCK_R <= 32; wider R: router_tile()
ROUTER_BLOCK_G = 16
ROUTER_BLOCK_RS = (16, 32, 64, 128, 256)  # BLOCK_R >= R: the compressor output stays in registers
ROUTER_WARPS = 4
ROUTER_SPLIT_MAX_M = 64    # up to this many tokens the router runs split (router_split + router_logits)
ROUTER_SPLIT_BLOCK_M = 8
ROUTER_SPLIT_BLOCK_R = 8   # compressor rows per program
ROUTER_SPLIT_BLOCK_H = 16  # H chunk; a split is a range of chunks
ROUTER_SPLIT_WARPS = 1     # 32 threads over an [8, 16] slice of x and of Wc: 4 contiguous values each (vector loads)

GROUP_ROWS_BLOCK = 1024
ATTENTION_BLOCK_M = 64      # WideMaskedAttention (the plugin's kernel): queries per program
ATTENTION_BLOCK_N = 32      # keys per step (64 spilled with the allowed tile in registers, Triton 3.6)
ATTENTION_BLOCK_DS = (64, 128)  # head sizes up to 64 take the d64 cubins, up to 128 the d128 ones
ATTENTION_WARPS = 4  # the decode kernel (d64) and the reduction
ATTENTION_PREFILL_WARPS = 8  # the prefill tile: 4 warps spilled on sm_80 / sm_90 (Triton 3.6: 255 registers)
ATTENTION_DECODE_BLOCK_H = 16  # the decode kernel's query heads per KV head (GQA ratio) in one tile
ATTENTION_DECODE_BLOCK_L = 64  # keys per decode step (attention.BLOCK_L)
ATTENTION_MAX_SPLITS = 64  # decode splits over the keys at most: the reduction's BLOCK_S (attention.MAX_SPLITS)
ATTENTION_TARGET_PROGRAMS = 264  # decode programs a call aims at (attention.SPLIT_TARGET_PROGRAMS)
ATTENTION_D128_DECODE_WARPS = 8  # d128 decode: 4 warps spilled (Triton 3.6: fp32 on sm_90, fp16 `any` on sm_80)
ATTENTION_STAGES = 2  # K / V tiles in flight: fp32 d128 needs 176 KB of shared memory at 3, over sm_80's 163 KB
CAST_BLOCK = 1024
APPLY_MASK_BLOCK_M = 8  # the dense path's mask pass: 8 rows x 256 channels per program
APPLY_MASK_BLOCK_N = 256

TILE_BLOCK_M = 64
TILE_BLOCK_N = 64
TILE_BLOCK_K = 64
TILE_WARPS = 4
STAGES = 3
TILE_GROUP_M = 8  # the tile GEMMs' L2 swizzle: 8 row tiles walk every column tile together (sources._tile_order)
UNALIGNED_BLOCK_K = 16  # K step of every GEMM tile when the call is not 16-aligned (see above)
GATED_UNALIGNED_WARPS = 8  # two accumulators + element-wise loads: 248-254 registers at 4 warps, 128-181 at 8
# float32 (PRECISE: IEEE FMA products, no tensor cores): a 64-deep K step at 4 warps spills up to 6 KB on sm_80
FP32_BLOCK_K = 32
# Unaligned float32: a K step of 16, the least Triton 3.6's tl.dot accepts (3.7+ take 8; the device image has 3.6.0),
# at 8 warps and 4 stages, the one setting without a spill on sm_80 and sm_90 under 3.6.0 and 3.9 (3 stages spilled
# 24 B on sm_90 under 3.6, 2 stages 8-16 B; docs/kernels.md, "Which Triton builds the cubins").
FP32_UNALIGNED_BLOCK_K = 16
FP32_UNALIGNED_STAGES = 4
FP32_WARPS = 8
FP32_GATED_UNALIGNED_STAGES = 2  # 3 stages spill 8 B on sm_90 (128 registers) once the tile GEMMs swizzle (GROUP_M)
ALIGN = 16  # the divisibility Triton's JIT specializes on (and the C runtime checks before launching a16)

GROUPED_BLOCK_M = 64

# "large", where the policy's prefill_tiles buckets say so: 128-row tiles (the tile kernels 128 x 128, grouped_n
# 128 x its group's BLOCK_N; gated: at most 64 wide), 8 warps (two warpgroups of wgmma), 4 stages. sm_90 only: 4
# stages of 32 KB are 128 KB, under Hopper's 227 KB but over the 99 KB of sm_86 / sm_89, which run the sm_80
# cubins. fp16 / bf16 only (float32 is the precise path, not the fast one). Not tuned on a GPU (none lent):
# `bench kernels` times every size class and measures policy["prefill_tiles"].
LARGE_BLOCK_M = 128
LARGE_TILE_BLOCK_N = 128
LARGE_GATED_BLOCK_N = 64  # gated (two accumulators): 128 x 128 spilled on sm_90 at 255 registers (8-104 B)
LARGE_WARPS = 8
LARGE_STAGES = 4  # 128 x 128 x 64 fp16: 32 KB a stage (gated 128 x 64: 32 KB), 128 KB in all
LARGE_ARCHS = (90,)  # compute capability majors * 10 whose cubins / JIT calls may take the large / wide tiles
# "wide": 128 x 256 x 64 (the tile of Triton's Hopper matmul tutorial for large fp16 GEMMs), 8 warps, 4 stages (48 KB
# a stage, 192 KB of Hopper's 227 KB: one CTA an SM, as at 3), tile_n (plain, bias) and tile_k only, a16 only:
# 210-222 registers, no spill on sm_90; its unaligned twin spilled 208 B (plain) / 224 B (bias), and a gated one
# (two 128 x 256 accumulators) cannot fit.
WIDE_BLOCK_M = 128
WIDE_BLOCK_N = 256
WIDE_WARPS = 8
WIDE_STAGES = 4

SIZES = ("small", "large", "wide")  # the prefill GEMMs' size classes, in order (the C runtime's class index)
# The GEMM families of the policy's prefill_tiles buckets and the size classes each has cubins for.
TILE_FAMILIES = {"tile_n": ("small", "large", "wide"), "tile_gated": ("small", "large"),
                 "tile_k": ("small", "large", "wide"), "grouped_n": ("small", "large"),
                 "grouped_gated": ("small", "large")}
# The family of each (kernel kind, algorithm) with size classes (the grouped K-pruned GEMM has one tile size).
FAMILY_OF = {("n", "tile"): "tile_n", ("gated", "tile"): "tile_gated", ("k", "tile"): "tile_k",
             ("n", "grouped"): "grouped_n", ("gated", "grouped"): "grouped_gated"}
ALIGNED_ONLY_SIZES = ("wide",)  # size classes without an `any` cubin: unaligned calls step down
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


def in_families(arch: int, families: tuple) -> bool:
    """Whether compute capability `arch` (90, 86, ...) is of one of `families` (90 = sm_90 and its minors)."""
    return arch // 10 * 10 in families


def large_tiles(arch: str, dtype: str) -> bool:
    """Whether calls on `arch` ('sm_90', 'interpreter', ...) in `dtype` may take the large / wide tiles (the
    interpreter may: that is how CPU tests run them)."""
    if dtype == "float32":
        return False
    return arch == "interpreter" or (arch.startswith("sm_") and in_families(int(arch[3:]), LARGE_ARCHS))


def family(kind: str, algo: str) -> str:
    """The prefill_tiles family (TILE_FAMILIES) of a `kind` ('n', 'gated', 'k') GEMM run by `algo`."""
    if (kind, algo) not in FAMILY_OF:
        raise ValueError(f"no size classes for {algo} {kind} GEMMs (the grouped K-pruned GEMM has one tile size)")
    return FAMILY_OF[kind, algo]


def size_for(fam: str, size: str, arch: str, dtype: str, aligned: bool) -> str:
    """The size class a call of family `fam` takes when `size` is asked for: `size` itself where this
    architecture and dtype have it (configs.large_tiles) and the call's alignment allows it
    (ALIGNED_ONLY_SIZES), else the next smaller class the family has; "small" always exists. The C
    runtime steps down the same way (wide_kernels.cpp: sized)."""
    sizes = TILE_FAMILIES[fam]
    if size not in sizes:
        raise ValueError(f"{fam} has no {size!r} tiles (it has {list(sizes)})")
    for s in reversed(sizes[:sizes.index(size) + 1]):
        if s == "small" or (large_tiles(arch, dtype) and (aligned or s not in ALIGNED_ONLY_SIZES)):
            return s
    return "small"


def is_aligned(*values: int) -> bool:
    """Every value (pointer address or dimension) a multiple of ALIGN: the a16 variants' assumption."""
    return all(int(v) % ALIGN == 0 for v in values)


def _unaligned(t: Tile, gated: bool) -> Tile:
    return Tile(t.block_m, t.block_n, UNALIGNED_BLOCK_K, max(t.num_warps, GATED_UNALIGNED_WARPS if gated else 0),
                t.num_stages)


def grouped_n_tile(group_size: int, gated: bool = False, aligned: bool = True, size: str = "small") -> Tile:
    bn = grouped_block_n(group_size)
    if size == "large":
        t = Tile(LARGE_BLOCK_M, min(bn, LARGE_GATED_BLOCK_N) if gated else bn, GROUPED_BLOCK_K, LARGE_WARPS,
                 LARGE_STAGES)
    elif size == "small":
        t = Tile(GROUPED_BLOCK_M, bn, GROUPED_BLOCK_K, 8 if bn == 128 else 4)
    else:
        raise ValueError(f"the grouped GEMMs have no {size!r} tiles")
    return t if aligned else _unaligned(t, gated)


def grouped_k_tile(aligned: bool = True) -> Tile:
    t = Tile(GROUPED_BLOCK_M, GROUPED_K_BLOCK_N, GROUPED_BLOCK_K, 8)
    return t if aligned else _unaligned(t, False)


def tile_tile(dtype: str = "float16", gated: bool = False, aligned: bool = True, size: str = "small") -> Tile:
    """The tile kernels' tile (tile_n, tile_k) for `dtype` ("float16" / "bfloat16" / "float32") in size class
    `size` (SIZES; "large" and "wide": fp16 / bf16 only, see LARGE_ARCHS; "wide": aligned, not gated)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}, got {size!r}")
    if size != "small" and dtype == "float32":
        raise ValueError(f"float32 has no {size} tile")
    if size == "wide":
        if gated or not aligned:
            raise ValueError("the wide tile is for aligned, ungated calls only (configs.size_for steps down)")
        return Tile(WIDE_BLOCK_M, WIDE_BLOCK_N, TILE_BLOCK_K, WIDE_WARPS, WIDE_STAGES)
    if size == "large":
        t = Tile(LARGE_BLOCK_M, LARGE_GATED_BLOCK_N if gated else LARGE_TILE_BLOCK_N, TILE_BLOCK_K, LARGE_WARPS,
                 LARGE_STAGES)
        return t if aligned else _unaligned(t, gated)
    if dtype == "float32":
        if aligned:
            return Tile(TILE_BLOCK_M, TILE_BLOCK_N, FP32_BLOCK_K, FP32_WARPS)
        return Tile(TILE_BLOCK_M, TILE_BLOCK_N, FP32_UNALIGNED_BLOCK_K, FP32_WARPS,
                    FP32_GATED_UNALIGNED_STAGES if gated else FP32_UNALIGNED_STAGES)
    t = Tile(TILE_BLOCK_M, TILE_BLOCK_N, TILE_BLOCK_K, TILE_WARPS)
    return t if aligned else _unaligned(t, gated)


def router_tile(block_r: int) -> tuple[int, int]:
    """(BLOCK_H, num_warps) of the fused router for BLOCK_R: the [BLOCK_H, BLOCK_R] float32 slice of Wc and
    the [BLOCK_M, BLOCK_R] compressor output live in registers, so a wider R takes a shorter H step and more
    warps (wider tiles spilled: tests/kernels/test_cubin_report.py)."""
    return {16: (ROUTER_BLOCK_H, ROUTER_WARPS), 32: (ROUTER_BLOCK_H, ROUTER_WARPS), 64: (32, ROUTER_WARPS),
            128: (32, 8), 256: (16, 8)}[block_r]
