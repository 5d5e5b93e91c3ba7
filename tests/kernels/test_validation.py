"""Argument validation of the Python kernel wrappers, on CPU tensors.

Every error must come before the library is loaded or CUDA is touched, so
these run anywhere. A call that passes validation with CPU tensors must stop
with a WideError saying the kernels need CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch

from wide_export.errors import WideError
from wide_export.native import kernels


@pytest.fixture(autouse=True)
def no_library(monkeypatch):
    """Validation must never reach the library."""

    def boom(*a, **k):
        raise AssertionError("validation reached the library")

    monkeypatch.setattr(kernels, "load_library", boom)


def _args(T=5, K=32, N=64, G=4, dtype=torch.float16, B=2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    mask = (torch.rand(B, T, G, generator=g) < 0.5).to(torch.int32)
    return x, w, mask, N // G


def test_valid_cpu_call_stops_at_the_device_check():
    x, w, mask, gs = _args()
    with pytest.raises(WideError, match="CUDA tensors"):
        kernels.masked_gemm_n(x, w, mask, gs)
    with pytest.raises(WideError, match="CUDA tensors"):
        kernels.masked_gated_mlp(x, w, w.clone(), mask, gs)
    xk, wk, maskk, _ = _args(K=64, N=48)
    with pytest.raises(WideError, match="CUDA tensors"):
        kernels.masked_gemm_k(xk, wk, maskk, 16)


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda a: a.update(x=a["x"][..., :31]), "last dimension 32"),
        (lambda a: a.update(w=a["w"].to(torch.float32)), "dtype"),
        (lambda a: a.update(x=a["x"].double(), w=a["w"].double()), "float32, float16 or bfloat16"),
        (lambda a: a.update(mask=a["mask"].long()), "int32"),
        (lambda a: a.update(mask=a["mask"][:, :, :3]), "mask must have shape"),
        (lambda a: a.update(group_size=12), "multiple of group_size"),
        (lambda a: a.update(group_size=0), "positive int"),
        (lambda a: a.update(group_size=True), "positive int"),
        (lambda a: a.update(x=a["x"].transpose(1, 2).contiguous().transpose(1, 2)), "unit stride"),
        (lambda a: a.update(x=a["x"].transpose(0, 1)), "evenly strided"),
        (lambda a: a.update(w=a["w"].t().contiguous().t()), "unit stride"),
        (lambda a: a.update(w=a["w"][0]), "2-D"),
        (lambda a: a.update(bias=torch.zeros(63, dtype=torch.float16)), "bias"),
        (lambda a: a.update(bias=torch.zeros(64, dtype=torch.float32)), "dtype"),
        (lambda a: a.update(layout=torch.zeros(5, dtype=torch.int32)), "layout"),
        (lambda a: a.update(out=torch.empty(2, 5, 63, dtype=torch.float16)), "out must have shape"),
        (lambda a: a.update(out=torch.empty(2, 5, 64, dtype=torch.float32)), "dtype"),
        (lambda a: a.update(algo="fastest"), "algo"),
    ],
)
def test_gemm_n_rejects(mutate, error):
    x, w, mask, gs = _args()
    a = dict(x=x, w=w, mask=mask, group_size=gs)
    mutate(a)
    with pytest.raises(ValueError, match=error):
        kernels.masked_gemm_n(**a)


def test_strided_rows_are_accepted_until_the_device_check():
    x, w, mask, gs = _args()
    wide = torch.randn(2, 5, 40).to(torch.float16)[..., :32]  # ldx = 40 > K
    with pytest.raises(WideError, match="CUDA"):
        kernels.masked_gemm_n(wide, w, mask, gs)


def test_gemm_k_groups_split_the_reduction_axis():
    x, w, mask, _ = _args(K=64, N=48)
    with pytest.raises(ValueError, match="K = 64 is not a multiple of group_size = 24"):
        kernels.masked_gemm_k(x, w, mask, 24)
    with pytest.raises(ValueError, match="mask must have shape"):
        kernels.masked_gemm_k(x, w, mask, 32)  # G = 2, mask has 4


def test_gated_needs_matching_up_weight():
    x, w, mask, gs = _args()
    with pytest.raises(ValueError, match="up weight"):
        kernels.masked_gated_mlp(x, w, w[:32], mask, gs)
    with pytest.raises(ValueError, match="up weight"):
        kernels.masked_gated_mlp(x, w, None, mask, gs)
    with pytest.raises(ValueError, match="bias"):
        kernels.prepare_gemm("gated", x, w, mask, gs, w2=w, bias=torch.zeros(64, dtype=w.dtype))
    with pytest.raises(ValueError, match="layout is only used"):
        kernels.prepare_gemm("k", x, torch.randn(8, 32).half(), mask, 8, layout=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="kind"):
        kernels.prepare_gemm("m", x, w, mask, gs)


def test_router_validation():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 3, 16, generator=g).half()
    wc, bc = torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    wr, br = torch.randn(6, 8, generator=g), torch.randn(6, generator=g)
    with pytest.raises(WideError, match="CUDA"):
        kernels.wide_router(h, wc, bc, wr, br)
    with pytest.raises(ValueError, match="float32"):
        kernels.wide_router(h, wc.half(), bc, wr, br)
    with pytest.raises(ValueError, match="router shapes disagree"):
        kernels.wide_router(h, wc, bc, wr[:5], br[:5])
    with pytest.raises(ValueError, match="last dimension 16"):
        kernels.wide_router(h[..., :15], wc, bc, wr, br)
    with pytest.raises(ValueError, match="mask must have shape"):
        kernels.wide_router(h, wc, bc, wr, br, out=torch.empty(2, 3, 4, dtype=torch.int32))


def test_mask_layout_validation():
    with pytest.raises(ValueError, match="int32"):
        kernels.mask_layout(torch.ones(4, 3))
    with pytest.raises(ValueError, match="at least one group"):
        kernels.mask_layout(torch.ones(4, 0, dtype=torch.int32))
    with pytest.raises(WideError, match="CUDA"):
        kernels.mask_layout(torch.ones(4, 3, dtype=torch.int32))
