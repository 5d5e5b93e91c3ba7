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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t,k,n,gs", [(1, 64, 96, 16), (3, 128, 256, 64), (17, 96, 128, 32)])
def test_cpu_ops_equal_the_references(ops, dtype, t, k, n, gs):
    """The CPU kernels' ops (mode cpu) on what the plugin passes: a bool mask slice, q rows of a fused qkv
    weight with its bias, gate / up halves of gate_up, down as W^T; masks all off, all on, mixed."""
    gen = torch.Generator().manual_seed(7 * k + t)
    x = torch.randn(t, k, generator=gen).to(dtype)
    qkv = torch.randn(n + 32, k, generator=gen).div(k**0.5).to(dtype)
    bias = torch.randn(n + 32, generator=gen).to(dtype)
    gate_up = torch.randn(2 * n, k, generator=gen).div(k**0.5).to(dtype)
    down = torch.randn(k, n, generator=gen).div(n**0.5).to(dtype)
    full = torch.rand(t, n // gs + 1, generator=gen) < 0.5
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    for mask in (full[:, 1:], torch.zeros(t, n // gs, dtype=torch.bool), torch.ones(t, n // gs, dtype=torch.bool)):
        q = ops.cpu_gemm_n(x, qkv[:n], mask, gs, bias[:n])
        torch.testing.assert_close(q, reference.masked_gemm_n(x, qkv[:n], mask, gs, bias[:n]), **tol)
        y = ops.cpu_gated(x, gate_up[:n], gate_up[n:], mask, gs)
        torch.testing.assert_close(y, reference.masked_gated_mlp(x, gate_up[:n], gate_up[n:], mask, gs), **tol)
        assert (q.view(t, -1, gs)[~mask] == 0).all() and (y.view(t, -1, gs)[~mask] == 0).all()
        o = torch.randn(t, n, generator=gen).to(dtype)  # attention output: skipped heads' channels not 0
        want = reference.masked_gemm_k(o, down, mask, gs)
        torch.testing.assert_close(ops.cpu_gemm_kt(o, down.t().contiguous(), mask, gs), want, **tol)
        torch.testing.assert_close(ops.cpu_gemm_kt(o, down.t(), mask, gs), want, **tol)  # a view: copied


def test_cpu_ops_opcheck_and_compile(ops):
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 64, generator=gen), torch.randn(32, 64, generator=gen) / 8
    b = torch.randn(32, generator=gen)
    mask = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0]], dtype=torch.bool)
    wd = torch.randn(64, 32, generator=gen) / 6
    torch.library.opcheck(ops.cpu_gemm_n.default, (x, w, mask, 16, b))
    torch.library.opcheck(ops.cpu_gated.default, (x, w, w.clone(), mask, 16))
    torch.library.opcheck(ops.cpu_gemm_kt.default, (x[:, :32].contiguous(), wd.t().contiguous(), mask, 16))

    def layer(xx, m):
        q = ops.cpu_gemm_n(xx, w, m, 16, b)
        return ops.cpu_gemm_kt(ops.cpu_gated(xx, w, w, m, 16) + q, wd.t().contiguous(), m, 16)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, mask), layer(x, mask))
