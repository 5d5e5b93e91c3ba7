"""The plugin's torch custom ops (wide_export/vllm/ops.py) against the PyTorch references, their fake
implementations under torch.library.opcheck and torch.compile. CPU tensors run the Triton kernels in the
interpreter; no vLLM needed."""

from __future__ import annotations

import pytest
import torch

from wide_export.ops import reference


@pytest.fixture(scope="module")
def ops():
    import wide_export.vllm.ops  # noqa: F401  registers torch.ops.wide_vllm

    return torch.ops.wide_vllm


def _router_args(t: int, h: int, r: int, g: int, gen):
    return (torch.randn(t, h, generator=gen), torch.randn(r, h, generator=gen) / h**0.5,
            0.1 * torch.randn(r, generator=gen), torch.randn(2 * g, r, generator=gen) / r**0.5,
            0.1 * torch.randn(2 * g, generator=gen))


@pytest.mark.parametrize("t,h,r,g", [(1, 64, 16, 4), (7, 96, 32, 12), (33, 64, 8, 2)])
def test_router_op_equals_the_reference(ops, t, h, r, g):
    args = _router_args(t, h, r, g, torch.Generator().manual_seed(t))
    got = ops.router(*args)
    assert got.dtype == torch.int32 and torch.equal(got, reference.wide_router(*args))
    assert 0 < int(got.sum()) < got.numel()  # both decisions occur


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,k,n,gs", [(1, 64, 96, 16), (9, 128, 64, 32)])
def test_masked_ops_equal_the_references(ops, dtype, t, k, n, gs):
    gen = torch.Generator().manual_seed(k + t)
    x = torch.randn(t, k, generator=gen).to(dtype)
    wg, wu = (torch.randn(n, k, generator=gen).div(k**0.5).to(dtype) for _ in range(2))
    mask = (torch.rand(t, n // gs, generator=gen) < 0.5).to(torch.int32)
    mask[0, 0], mask[0, -1] = 1, 0
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    y = ops.masked_gated_mlp(x, wg, wu, mask, gs)
    torch.testing.assert_close(y, reference.masked_gated_mlp(x, wg, wu, mask, gs), **tol)
    assert (y.view(t, -1, gs)[~mask.bool()] == 0).all()  # skipped channels exactly 0
    wd = torch.randn(k, n, generator=gen).div(n**0.5).to(dtype)  # down: [K_out, N_in]
    torch.testing.assert_close(ops.masked_gemm_k(y, wd, mask, gs), reference.masked_gemm_k(y, wd, mask, gs), **tol)


def test_opcheck_and_compile(ops):
    gen = torch.Generator().manual_seed(0)
    args = _router_args(5, 64, 16, 4, gen)
    torch.library.opcheck(ops.router.default, args)
    x, w = torch.randn(5, 64, generator=gen), torch.randn(32, 64, generator=gen) / 8
    mask = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], dtype=torch.int32)
    torch.library.opcheck(ops.masked_gated_mlp.default, (x, w, w.clone(), mask, 16))
    torch.library.opcheck(ops.masked_gemm_k.default, (x[:, :32].contiguous(), w.T.contiguous(), mask, 16))

    def layer(h, xx):  # what the plugin's decoder layer calls, traced whole through the fake implementations
        m = ops.router(h, *args[1:])[:, :2]
        return ops.masked_gemm_k(ops.masked_gated_mlp(xx, w, w, m, 16), w.T.contiguous(), m, 16)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(args[0], x), layer(args[0], x))
