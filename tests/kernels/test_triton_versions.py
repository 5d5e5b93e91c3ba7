"""Every tile builds under each Triton the project accepts (>= 3.6, the device image's).

Triton 3.6's tl.dot asserts "Input shapes should have M >= 1, N >= 1 and K >= 16" (its frontend, for
input_precision="ieee" as for the tensor-core precisions); newer releases accept a K step of 8, so a tile that
only they compile passed CI's build and would have failed the device's. Here by hand, for every tile of
configs.py that reaches a tl.dot, JIT and AOT alike. The build itself under 3.6.0 is CI's
scripts/device-dry-run.sh."""

from __future__ import annotations

import itertools

import pytest

from wide_export.kernels import aot
from wide_export.kernels import configs as cfg

DOT_MIN = 16  # Triton 3.6.0: M, N >= 1 and K >= 16 for tl.dot


def _jit_tiles():
    for dtype, gated, aligned in itertools.product(cfg.DTYPES, (False, True), (False, True)):
        for size in cfg.SIZES:
            if size != "small" and dtype == "float32" or size == "wide" and (gated or not aligned):
                continue
            yield f"tile {dtype} gated={gated} aligned={aligned} {size}", cfg.tile_tile(dtype, gated, aligned, size)
    for bn, gated, aligned, size in itertools.product(cfg.GROUPED_BLOCK_NS, (False, True), (False, True),
                                                      ("small", "large")):
        yield f"grouped_n bn{bn} gated={gated} aligned={aligned} {size}", cfg.grouped_n_tile(bn, gated, aligned,
                                                                                              size)
    for aligned in (False, True):
        yield f"grouped_k aligned={aligned}", cfg.grouped_k_tile(aligned)


@pytest.mark.parametrize("name,tile", list(_jit_tiles()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_jit_gemm_tile_has_a_k_step_triton_3_6_compiles(name, tile):
    assert tile.block_k >= DOT_MIN and tile.block_m >= 1 and tile.block_n >= 1, (name, tile)


def test_every_aot_gemm_spec_has_a_k_step_triton_3_6_compiles():
    gemms = [s for s in aot.specs() if s.key.split("/")[0] in aot.GEMMS]
    assert len(gemms) > 100  # every dtype, variant, flavour and size class
    bad = [(s.key, s.variant, dict(s.constexprs)["BLOCK_K"]) for s in gemms if dict(s.constexprs)["BLOCK_K"] < DOT_MIN]
    assert not bad, bad


def test_router_dots_have_k_steps_triton_3_6_compiles():
    """The fused router's dots: x @ Wc (K = BLOCK_H) and z @ Wr (K = BLOCK_R)."""
    for br in cfg.ROUTER_BLOCK_RS:
        block_h, _ = cfg.router_tile(br)
        assert block_h >= DOT_MIN and br >= DOT_MIN, br
