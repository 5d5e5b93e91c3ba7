"""GPU checks of the plugins and the engine (markers gpu + trt: skipped without a CUDA GPU).

Each plugin runs alone in a one-layer network against the PyTorch reference
(wide_export.ops.reference), with fresh random inputs, random masks (including
all-off and all-on rows) and a NaN-poisoned output; then the demo model's
engine with the plugins runs prefill + decode steps through Polygraphy's
TrtRunner against the reference (`wide-export verify --engine`).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from wide_export.ops.reference import REFERENCES, router_logits
from wide_export.trt.plugins import PLUGIN_NAMES

pytestmark = [pytest.mark.gpu, pytest.mark.trt]

GROUP_SIZE = 16
TOL = {"float32": dict(atol=1e-4, rtol=1e-3), "float16": dict(atol=2e-2, rtol=2e-2)}


def _attention_feeds(dims, dtype, batch, tokens, rng):
    """q, k, v over a past of 3 keys, the model's allowed mask (causal; row 0 left-padded so that its first
    query is allowed no key: the mean of every value), a head mask with an all-off and an all-on token."""
    heads, d = dims["q"][1], dims["q"][3]
    kv_heads, groups, keys = dims["k"][1], dims["head_mask"][-1], tokens + 3
    causal = np.arange(keys)[None, :] <= (keys - tokens + np.arange(tokens))[:, None]
    real = np.ones((batch, keys), bool)
    real[0, :keys - tokens + 1] = False  # row 0 padded through its first query's position
    mask = rng.integers(0, 2, (batch, tokens, groups)).astype(np.int32)
    mask[0, 0, :] = 0
    mask[-1, -1, :] = 1
    return {"q": rng.standard_normal((batch, heads, tokens, d)).astype(dtype),
            "k": rng.standard_normal((batch, kv_heads, keys, d)).astype(dtype),
            "v": rng.standard_normal((batch, kv_heads, keys, d)).astype(dtype),
            "allowed": causal[None, None] & real[:, None, None, :], "head_mask": mask}


def _feeds(op, model, weights, batch, tokens, rng):
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    dtype = np.float16 if model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
    if op == "WideMaskedAttention":
        return _attention_feeds(dims, dtype, batch, tokens, rng)
    first = model.graph.input[0].name
    feeds = {first: rng.standard_normal((batch, tokens, dims[first][-1])).astype(dtype)}
    if "mask" in dims:
        mask = rng.integers(0, 2, (batch, tokens, dims["mask"][-1])).astype(np.int32)
        mask[0, 0, :] = 0  # a token with every group off
        mask[-1, -1, :] = 1  # and one with every group on
        feeds["mask"] = mask
    return feeds


def _reference(op, feeds, weights):
    t = {k: torch.from_numpy(v) for k, v in {**feeds, **weights}.items()}
    if op == "WideRouter":
        return REFERENCES[op](t["hidden"], t["wc"], t["bc"], t["wr"], t["br"]).numpy()
    if op == "WideMaskedGemmN":
        return REFERENCES[op](t["x"], t["w"], t["mask"], GROUP_SIZE, bias=t["bias"]).numpy()
    if op == "WideMaskedGatedMlp":
        return REFERENCES[op](t["x"], t["w"], t["w2"], t["mask"], GROUP_SIZE).numpy()
    if op == "WideMaskedAttention":
        from wide_export.trt.oneop import ATTENTION_HEADS

        return REFERENCES[op](t["q"], t["k"], t["v"], t["allowed"], t["head_mask"], ATTENTION_HEADS[2]).numpy()
    return REFERENCES[op](t["x"], t["w"], t["mask"], GROUP_SIZE).numpy()


@pytest.mark.parametrize("op", sorted(PLUGIN_NAMES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("batch, tokens", [(1, 1), (3, 1), (2, 7), (4, 8)])  # decode GEMV and prefill shapes
def test_plugin_matches_reference(op, dtype, batch, tokens, plugin_lib, tmp_path):
    from wide_export.trt.oneop import build_one_op_engine, one_op_model, run_one_op_engine

    rng = np.random.default_rng()
    model, weights = one_op_model(op, dtype=dtype, group_size=GROUP_SIZE, has_bias=True,
                                  seed=int(rng.integers(1 << 30)))
    onnx.save(model, str(tmp_path / "m.onnx"))
    info = build_one_op_engine(tmp_path / "m.onnx", tmp_path / "m.engine", plugins=plugin_lib)
    assert info["plugin_layers"] == 1
    feeds = _feeds(op, model, weights, batch, tokens, rng)
    got = run_one_op_engine(tmp_path / "m.engine", feeds, tmp_path, plugins=plugin_lib)
    want = _reference(op, feeds, weights)
    assert got.shape == want.shape and got.dtype == want.dtype
    if op == "WideRouter":  # decisions agree except on float32 near-ties (summation order)
        t = {k: torch.from_numpy(v) for k, v in {**feeds, **weights}.items()}
        logits = router_logits(t["hidden"], t["wc"], t["bc"], t["wr"], t["br"]).numpy()
        near_tie = np.abs(logits[..., 0] - logits[..., 1]) < 1e-4
        assert np.all((got == want) | near_tie)
    else:
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), **TOL[dtype])
        if op == "WideMaskedAttention":  # heads of skipped groups are exactly zero
            from wide_export.trt.oneop import ATTENTION_HEADS

            off = np.repeat(feeds["head_mask"], ATTENTION_HEADS[2], axis=-1).transpose(0, 2, 1) == 0  # [B, Hq, T]
            assert np.all(got[off] == 0)
        if "mask" in feeds and op != "WideMaskedGemmK":  # skipped outputs are exactly zero
            off = np.repeat(feeds["mask"], GROUP_SIZE, axis=-1) == 0
            assert np.all(got[off] == 0)


def test_demo_engine_matches_reference(demo_onnx, plugin_lib, tmp_path):
    from wide_export.trt.build_engines import build_engine
    from wide_export.trt.verify import verify_engine

    build_engine(demo_onnx, tmp_path / "engine", plugins=plugin_lib, mask_outputs=True, progress=False,
                 limits={"max_batch": 2, "max_input_len": 16, "max_seq_len": 32})
    report = verify_engine(tmp_path / "engine", report_path=tmp_path / "report.json", steps=3, batch=2,
                           prompt_len=7)
    assert report.outputs and report.decisions, report.to_dict()
    assert report.passed, report.to_dict()
