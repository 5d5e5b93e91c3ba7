"""The mask pass of the plugins' dense path (cuBLASLt GEMM + wide_apply_mask_kernel), on CPU in Triton's interpreter.

The C runtime launches the AOT cubins of this kernel after (gemm_n, gated) or before (gemm_k, on x)
cublasLtMatmul; here the kernel itself runs against a PyTorch computation of the same formula.
"""

from __future__ import annotations

import pytest
import torch

from wide_export.kernels import configs
from wide_export.kernels.launch import kernels, triton_cdiv


def _run(src, src2, mask, group_size, gated, dst=None, ld_src=None):
    M, N = mask.shape[0], src2.shape[1]
    dst = torch.empty((M, N), dtype=src.dtype) if dst is None else dst
    grid = (triton_cdiv(M, configs.APPLY_MASK_BLOCK_M), triton_cdiv(N, configs.APPLY_MASK_BLOCK_N))
    kernels().wide_apply_mask_kernel[grid](src, src2, dst, mask, M, N, mask.shape[1], group_size,
                                           ld_src or N, GATED=gated, BLOCK_M=configs.APPLY_MASK_BLOCK_M,
                                           BLOCK_N=configs.APPLY_MASK_BLOCK_N)
    return dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("M, gs, G", [(1, 16, 4), (9, 24, 11), (17, 128, 3)])
def test_mask_pass_keeps_executing_groups_and_zeroes_the_rest(dtype, gated, M, gs, G):
    gen = torch.Generator().manual_seed(M * 100 + gs)
    N = gs * G
    y = torch.randn(M, N, generator=gen).to(dtype)
    y[0, 0] = float("nan")  # a skipped NaN must still come out as an exact 0
    up = torch.randn(M, N, generator=gen).to(dtype)
    mask = (torch.rand(M, G, generator=gen) < 0.5).to(torch.int32)
    mask[0, 0] = 0
    keep = mask.bool().repeat_interleave(gs, dim=1)
    v = y.float()
    if gated:
        v = torch.nn.functional.silu(v) * up.float()
    want = torch.where(keep, v, torch.zeros(())).to(dtype)
    got = _run(y.clone(), up, mask, gs, gated)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
    assert (got[~keep] == 0).all() and not torch.isnan(got).any()


def test_mask_pass_in_place_and_on_strided_rows():
    """gemm_n runs it in place on y; gemm_k on x rows of stride ld_src into a [M, K] copy."""
    gen = torch.Generator().manual_seed(3)
    M, gs, G = 5, 32, 9
    K = gs * G
    x = torch.randn(M, K + 8, generator=gen)  # rows of stride K + 8
    mask = (torch.rand(M, G, generator=gen) < 0.5).to(torch.int32)
    keep = mask.bool().repeat_interleave(gs, dim=1)
    xm = torch.full((M, K), 7.0)
    _run(x, xm, mask, gs, False, dst=xm, ld_src=K + 8)
    assert torch.equal(xm, torch.where(keep, x[:, :K], torch.zeros(())))
    y = torch.randn(M, K, generator=gen)
    ref = torch.where(keep, y, torch.zeros(()))
    _run(y, y, mask, gs, False, dst=y)
    assert torch.equal(y, ref)
