"""Each `wide` function body (run by stock ONNX Runtime) against its PyTorch reference."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest
import torch

from wide_export.ops import reference as R
from wide_export.ops.functions import function_protos
from wide_export.ops.spec import OPS, plugin_attrs

ONNX_TYPES = {np.float32: onnx.TensorProto.FLOAT, np.float16: onnx.TensorProto.FLOAT16, np.int32: onnx.TensorProto.INT32}


def run_node(op: str, inputs: list[np.ndarray], out_type: int, out_rank: int = 3, **ints) -> np.ndarray:
    names = [f"in{i}" for i in range(len(inputs))]
    node = oh.make_node(op, names, ["y"], domain="wide", **plugin_attrs(**ints))
    graph = oh.make_graph(
        [node], op,
        [oh.make_tensor_value_info(n, ONNX_TYPES[a.dtype.type], list(a.shape)) for n, a in zip(names, inputs)],
        [oh.make_tensor_value_info("y", out_type, [f"d{i}" for i in range(out_rank)])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20), oh.make_opsetid("wide", 1)],
                          functions=function_protos(20))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))[0]


def random_mask(shape, sparsity: float, gen) -> torch.Tensor:
    return (torch.rand(shape, generator=gen) >= sparsity).to(torch.int32)


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=2e-2, atol=2e-2)}
CASES = [  # (batch, tokens, K, groups, group_size)
    (1, 1, 16, 1, 8),
    (2, 7, 24, 4, 8),
    (3, 5, 40, 12, 3),
    (1, 33, 64, 32, 4),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_masked_gemms_match_reference(case, sparsity, dtype):
    b, t, k, g, gs = case
    n = g * gs
    gen = torch.Generator().manual_seed(hash((case, sparsity)) % 2**31)
    x = torch.randn(b, t, k, generator=gen).to(dtype)
    w, w2 = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype), (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    mask = random_mask((b, t, g), sparsity, gen)
    out_type = ONNX_TYPES[np.float16 if dtype == torch.float16 else np.float32]
    np_ = lambda a: a.numpy()

    y = run_node("WideMaskedGemmN", [np_(x), np_(w), np_(mask), np_(bias)], out_type, group_size=gs, has_bias=1)
    want = R.masked_gemm_n(x, w, mask, gs, bias)
    torch.testing.assert_close(torch.from_numpy(y), want, **TOL[dtype])
    assert np.all(y[np.repeat(np_(mask), gs, -1) == 0] == 0), "skipped outputs must be exactly 0"

    y = run_node("WideMaskedGatedMlp", [np_(x), np_(w), np_(w2), np_(mask)], out_type, group_size=gs)
    torch.testing.assert_close(torch.from_numpy(y), R.masked_gated_mlp(x, w, w2, mask, gs), **TOL[dtype])

    xk = torch.randn(b, t, n, generator=gen).to(dtype)
    xk[torch.repeat_interleave(mask, gs, -1) == 0] = 1e4  # skipped inputs are ignored whatever they hold
    wk = (torch.randn(k, n, generator=gen) / n**0.5).to(dtype)
    zeros = torch.zeros(k, dtype=dtype)
    y = run_node("WideMaskedGemmK", [np_(xk), np_(wk), np_(mask), np_(zeros)], out_type, group_size=gs, has_bias=0)
    torch.testing.assert_close(torch.from_numpy(y), R.masked_gemm_k(xk, wk, mask, gs), **TOL[dtype])
    # with a bias (o_proj of attention_bias checkpoints): added to every output, whatever the mask
    bk = torch.randn(k, generator=gen).to(dtype)
    y = run_node("WideMaskedGemmK", [np_(xk), np_(wk), np_(mask), np_(bk)], out_type, group_size=gs, has_bias=1)
    keep = torch.repeat_interleave(mask, gs, -1).bool()
    by_hand = torch.where(keep, xk.double(), 0.0) @ wk.double().T + bk.double()
    torch.testing.assert_close(torch.from_numpy(y).double(), by_hand, **TOL[dtype])
    torch.testing.assert_close(R.masked_gemm_k(xk, wk, mask, gs, bk).double(), by_hand, **TOL[dtype])
    off = mask.sum(-1) == 0
    if off.any():  # all groups off gives exactly the bias
        assert np.array_equal(y[off.numpy()], np.broadcast_to(np_(bk), y[off.numpy()].shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("groups,rank", [(1, 4), (4, 8), (32, 16)])
def test_router_matches_reference(groups, rank, dtype):
    gen = torch.Generator().manual_seed(groups * 100 + rank)
    h = torch.randn(2, 9, 32, generator=gen).to(dtype)
    wc, bc = torch.randn(rank, 32, generator=gen) / 32**0.5, torch.randn(rank, generator=gen)
    wr, br = torch.randn(2 * groups, rank, generator=gen) / rank**0.5, torch.randn(2 * groups, generator=gen)
    y = run_node("WideRouter", [t.numpy() for t in (h, wc, bc, wr, br)], onnx.TensorProto.INT32, num_groups=groups)
    want = R.wide_router(h, wc, bc, wr, br)
    logits = R.router_logits(h, wc, bc, wr, br)
    clear = (logits[..., 0] - logits[..., 1]).abs() > 1e-5  # exact ties may round either way
    assert y.dtype == np.int32 and y.shape == tuple(want.shape)
    assert np.array_equal(y[clear.numpy()], want.numpy()[clear.numpy()])
    assert 0 < want.float().mean() < 1 or groups == 1


def test_router_ties_execute():
    """l0 == l1 must execute (argmax picks index 0)."""
    h = torch.randn(1, 3, 8)
    wc, bc = torch.zeros(2, 8), torch.zeros(2)
    wr, br = torch.zeros(4, 2), torch.tensor([0.5, 0.5, 0.0, 1.0])  # group 0 tie, group 1 skip
    y = run_node("WideRouter", [t.numpy() for t in (h, wc, bc, wr, br)], onnx.TensorProto.INT32, num_groups=2)
    assert y.tolist() == [[[1, 0]] * 3]
    assert R.wide_router(h, wc, bc, wr, br).tolist() == [[[1, 0]] * 3]


ONNX_TYPES[np.bool_] = onnx.TensorProto.BOOL


def _allowed(B: int, T: int, S: int, pad: list[int]) -> torch.Tensor:
    """bool [B, 1, T, S]: causal over a past of S - T positions, the first pad[b] positions of row b padding."""
    causal = torch.arange(S)[None, :] <= (S - T + torch.arange(T))[:, None]
    real = torch.arange(S)[None, :] >= torch.tensor(pad)[:, None]
    return causal[None, None] & real[:, None, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("B,Hq,Hk,D,T,S,gh", [(1, 4, 4, 8, 1, 5, 1), (2, 8, 2, 16, 3, 7, 2), (3, 6, 2, 32, 4, 4, 3),
                                            (1, 16, 4, 64, 1, 33, 4)])
@pytest.mark.parametrize("kind", ["all-on", "random", "all-off"])
def test_masked_attention_matches_reference(dtype, B, Hq, Hk, D, T, S, gh, kind):
    """WideMaskedAttention's body (GQA through Expand + Reshape, the scale through float32, the float32 floor,
    softmax in float32) against reference.wide_masked_attention, which is the model's own attention; the heads
    of skipped groups exactly 0; a fully padded row stays finite."""
    gen = torch.Generator().manual_seed(B * 1000 + Hq * 10 + T)
    q, k, v = (torch.randn(B, h, n, D, generator=gen).to(dtype) for h, n in ((Hq, T), (Hk, S), (Hk, S)))
    G = Hq // gh
    head_mask = {"all-on": torch.ones(B, T, G, dtype=torch.int32), "all-off": torch.zeros(B, T, G, dtype=torch.int32),
                 "random": random_mask((B, T, G), 0.5, gen)}[kind]
    allowed = _allowed(B, T, S, [min(b, S - T) for b in range(B)])
    out_type = ONNX_TYPES[np.float16 if dtype == torch.float16 else np.float32]
    y = run_node("WideMaskedAttention", [q.numpy(), k.numpy(), v.numpy(), allowed.numpy(), head_mask.numpy()],
                 out_type, out_rank=4, group_heads=gh)
    want = R.wide_masked_attention(q, k, v, allowed, head_mask, gh)
    assert np.isfinite(y).all()
    torch.testing.assert_close(torch.from_numpy(y), want, **TOL[dtype])
    keep = head_mask.bool().repeat_interleave(gh, -1).transpose(1, 2)  # [B, Hq, T]
    assert np.all(y[~keep.numpy()] == 0), "heads of skipped groups must be exactly 0"
    if kind == "all-on":  # by hand, in float64: softmax(q k^T / sqrt(D)) v over the allowed positions
        kr, vr = (t.double().repeat_interleave(Hq // Hk, 1) for t in (k, v))
        scores = (q.double() @ kr.transpose(-1, -2)) / D**0.5
        by_hand = torch.softmax(scores.masked_fill(~allowed, -1e300), -1) @ vr
        torch.testing.assert_close(torch.from_numpy(y).double(), by_hand, **TOL[dtype])


def test_every_op_is_documented_with_its_fields():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "opset.md").read_text()
    for name, spec in OPS.items():
        assert f"## {name}" in doc
        section = doc.split(f"## {name}", 1)[1].split("\n## ", 1)[0]
        for field in (*spec.inputs, *spec.outputs, *spec.int_attrs):
            assert re.search(rf"`{field}`", section), f"{name}: {field} not documented"
    assert {f.name for f in function_protos()} == set(OPS)
    assert set(R.REFERENCES) == set(OPS)
