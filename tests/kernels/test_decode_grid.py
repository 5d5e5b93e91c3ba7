"""The decode launch grids (wide_export.kernels.launch.*_plan) at Llama-3.1-8B shapes fill >= 2 waves of CTAs
on an H200's 132 SMs, and the launches use exactly these plans. Pure arithmetic: no GPU, no kernel."""

from __future__ import annotations

import pytest

from wide_export.kernels import configs as cfg
from wide_export.kernels import launch

SMS = 132  # H200
TWO_WAVES = 2 * SMS
# Llama-3.1-8B decode projections: (name, kind, N, K); q and gate/up are N-pruned, o and down K-pruned.
LLAMA_8B = (("q", "n", 4096, 4096), ("o", "k", 4096, 4096), ("gate_up", "gated", 14336, 4096),
            ("down", "k", 4096, 14336))
TOKENS = tuple(range(1, 9))


def _plan(kind, M, N, K, sms=SMS):
    return launch.gemv_k_plan(M, N, K, sms) if kind == "k" else launch.gemv_n_plan(M, N, K, sms)


@pytest.mark.parametrize("M", TOKENS)
@pytest.mark.parametrize("name,kind,N,K", LLAMA_8B, ids=[s[0] for s in LLAMA_8B])
def test_gemv_grids_fill_two_waves_at_8b_shapes(name, kind, N, K, M):
    plan = _plan(kind, M, N, K)
    assert plan.ctas >= TWO_WAVES, f"{name} T={M}: {plan.grid} = {plan.ctas} CTAs, {plan.waves(SMS):.2f} waves"


@pytest.mark.parametrize("M", TOKENS)
@pytest.mark.parametrize("R", (16, 32, 64, 128, 256))
def test_router_grid_fills_two_waves_at_8b_hidden(R, M):
    plan = launch.router_plan(M, 4096, R, SMS)
    assert plan.kernel == "wide_router_split_kernel"
    assert plan.ctas >= TWO_WAVES, f"R={R} T={M}: {plan.grid} = {plan.ctas} CTAs"


def test_plans_by_hand_at_t1():
    """T = 1 grids computed by hand from the tile sizes (8 outputs x 256-wide K chunks for N-pruned, 32 x 128
    for K-pruned) and the 4-wave target (528 CTAs)."""
    # q: 512 tiles < 528 -> 2 splits of the 16 chunks: 1024 CTAs (about 512 execute at 50 % sparsity)
    q = launch.gemv_n_plan(1, 4096, 4096, SMS)
    assert (q.grid, q.chunks_per_split) == ((1, 512, 2), 8)
    assert launch.gemv_n_plan(1, 14336, 4096, SMS).grid == (1, 14336 // 8, 1)  # gate/up: 1792 CTAs, no split
    # o: 128 tiles of 32 outputs, 32 chunks; 4 * 132 / 128 -> 5 splits of ceil(32 / 5) = 7 chunks -> 5 splits
    o = launch.gemv_k_plan(1, 4096, 4096, SMS)
    assert (o.grid, o.chunks_per_split) == ((1, 128, 5), 7)
    # down: 112 chunks -> 5 splits of 23 chunks
    d = launch.gemv_k_plan(1, 4096, 14336, SMS)
    assert (d.grid, d.chunks_per_split) == ((1, 128, 5), 23)
    # router R = 64: 8 row tiles, 256 chunks of 16; 528 / 8 = 66 splits -> 4 chunks each -> 64 splits
    r = launch.router_plan(1, 4096, 64, SMS)
    assert (r.grid, r.chunks_per_split) == ((1, 8, 64), 4)


@pytest.mark.parametrize("M,N,K,sms", [(1, 200, 800, 132), (3, 4096, 4096, 132), (8, 4096, 14336, 132),
                                       (1, 32, 128, 132), (2, 4096, 14336, 1), (5, 100, 1000, 7), (1, 64, 130, 2)])
def test_splits_partition_the_k_chunks(M, N, K, sms):
    """Every K chunk belongs to exactly one split and no split is empty."""
    for plan, chunks in ((launch.gemv_k_plan(M, N, K, sms), -(-K // cfg.GEMV_K_BLOCK_K)),
                         (launch.gemv_n_plan(M, N, K, sms), -(-K // cfg.GEMV_BLOCK_K))):
        _check_partition(plan, chunks)


def _check_partition(plan, chunks):
    covered = sorted(c for s in range(plan.splits)
                     for c in range(s * plan.chunks_per_split, min((s + 1) * plan.chunks_per_split, chunks)))
    assert covered == list(range(chunks))
    assert all(s * plan.chunks_per_split < chunks for s in range(plan.splits))
    assert plan.grid[2] == plan.splits


def test_workspace_cap_limits_the_splits():
    assert launch.gemv_k_plan(1, 4096, 14336, SMS, max_splits=2).splits == 2


def test_prefill_router_is_the_fused_kernel():
    plan = launch.router_plan(4096, 4096, 64, SMS)
    assert plan.kernel == "wide_router_kernel" and plan.grid == (4096 // cfg.ROUTER_BLOCK_M, 1, 1)


def test_launches_use_the_plans(monkeypatch):
    """The grids the launches pass to the kernels are the plans' (CPU interpreter, small shapes)."""
    import torch

    from wide_export import kernels

    seen = []
    real = launch._launch

    def spy(kernel, grid, *args, **kw):
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel), tuple(grid)))
        return real(kernel, grid, *args, **kw)

    monkeypatch.setattr(launch, "_launch", spy)
    x = torch.randn(2, 300)
    kernels.masked_gemm_k(x, torch.randn(40, 300), torch.ones(2, 3, dtype=torch.int32), 100, algo="gemv")
    kernels.masked_gemm_n(x, torch.randn(40, 300), torch.ones(2, 4, dtype=torch.int32), 10, algo="gemv")
    kernels.router(x, torch.randn(24, 300), torch.randn(24), torch.randn(6, 24), torch.randn(6))
    grids = [g for _, g in seen]
    assert launch.gemv_k_plan(2, 40, 300, cfg.DECODE_SMS).grid in grids
    assert launch.gemv_n_plan(2, 40, 300, cfg.DECODE_SMS).grid in grids
    assert launch.router_plan(2, 300, 24, cfg.DECODE_SMS).grid in grids
