"""bfloat16 end to end on CPU: `onnx --dtype bfloat16`, the fp32 -> bf16 conversion `trt --bf16`
uses, their verification by onnx's reference evaluator, and `triton` refusing a bf16 model in one line.

The checkpoint is a Llama with `attention_bias: true` (q, k, v and o_proj biases), so both issue-21
features go through together.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from tests.export.test_fp16 import _types
from tests.helpers import assert_one_line_error, make_checkpoint
from wide_export.export.fp16 import convert_export

BF16, F32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(bf16 export, float32 export converted to bf16) of an attention_bias Llama checkpoint."""
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx

    tmp = tmp_path_factory.mktemp("bf16")
    folder = make_checkpoint(tmp / "ckpt", arch="llama", attention_bias=True)
    export_onnx(load_wide_model(folder, dtype="bfloat16"), tmp / "bf16")
    export_onnx(load_wide_model(folder, dtype="float32"), tmp / "f32")
    (tmp / "conv").mkdir()
    convert_export(tmp / "f32", tmp / "conv", dtype="bfloat16")
    return tmp / "bf16", tmp / "conv"


def test_bf16_export_keeps_routers_norms_and_logits_float32(exports):
    bf16, _ = exports
    nodes, io, fp32_weights, wide = _types(bf16)
    assert io["logits"] == F32 and io["present.0.key"] == BF16 and io["past_key_values.1.value"] == BF16
    assert any("router" in n for n in fp32_weights)  # router weights stay float32 ...
    assert not [n for n in fp32_weights if "_proj." in n or "embed" in n or "norm" in n]  # ... the model's do not
    model = onnx.load(str(bf16 / "model.onnx"))
    o_bias = [t for t in model.graph.initializer if t.name.endswith("o_proj.bias")]
    assert len(o_bias) == 2 and all(t.data_type == BF16 for t in o_bias)
    k_nodes = [n for n in model.graph.node if n.op_type == "WideMaskedGemmK"]
    has_bias = {n.name: next(a.i for a in n.attribute if a.name == "has_bias") for n in k_nodes}
    assert has_bias == {"/model/layers.0/self_attn/o_proj/WideMaskedGemmK": 1,
                        "/model/layers.1/self_attn/o_proj/WideMaskedGemmK": 1,
                        "/model/layers.0/mlp/down_proj/WideMaskedGemmK": 0,
                        "/model/layers.1/mlp/down_proj/WideMaskedGemmK": 0}
    stats = [n for n in nodes if n.endswith("/ReduceMean")]  # RMSNorm statistics in float32
    assert stats and all(nodes[n][0][0] == F32 for n in stats)
    config = json.loads((bf16 / "wide_config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["config"]["o_bias"] is True


def test_converted_graph_has_the_types_of_the_bf16_export(exports):
    bf16, conv = exports
    got_nodes, got_io, got_fp32, got_wide = _types(conv)
    want_nodes, want_io, want_fp32, want_wide = _types(bf16)
    assert got_io == want_io and got_fp32 == want_fp32 and got_wide == want_wide
    assert onnx.TensorProto.FLOAT16 not in {t for ins, outs in got_nodes.values() for t in (*ins, *outs)}
    common = [n for n in set(got_nodes) & set(want_nodes) if not n.rsplit("/", 1)[-1].startswith("Cast")]
    assert len(common) > 0.8 * len(want_nodes)
    assert not {n: (got_nodes[n], want_nodes[n]) for n in common if got_nodes[n] != want_nodes[n]}
    config = json.loads((conv / "wide_config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["fp16_conversion"]["to"] == "bfloat16"


# The converted graph only exists inside `trt --bf16` and is checked whole: the converter's Cast nodes do not
# follow the module-tree names that slicing cuts at (as for --fp16).
@pytest.mark.parametrize("which,sliced", [("export", False), ("export", True), ("converted", False)])
def test_bf16_graph_is_verified_by_the_reference_evaluator(exports, which, sliced):
    from wide_export.pipelines.verify import verify_onnx
    from wide_export.verify.tolerances import tolerance_for

    folder = exports[0] if which == "export" else exports[1]
    report = verify_onnx(folder, steps=2, sliced=sliced)
    assert report.target == "onnx-reference-evaluator" and report.dtype == "bfloat16"
    assert report.tolerance == tolerance_for("bfloat16").to_dict()
    assert report.passed, report.to_dict()
    logits = next(r for r in report.outputs if r.name == "logits")
    assert 0 < logits.mean_abs < 0.1  # bf16 rounding is there (not a float32 run), and small


def test_evaluator_runs_bf16_between_nodes(exports):
    """The evaluator computes in bf16 as written: presents are bf16 (not float32 upcasts)."""
    from wide_export.verify.evaluator import EvaluatorSession, bfloat16

    bf16, _ = exports
    session = EvaluatorSession(onnx.load(str(bf16 / "model.onnx")), bf16)
    feed = {"input_ids": np.array([[1, 2, 3]]), "attention_mask": np.ones((1, 3), np.int64),
            "position_ids": np.array([[0, 1, 2]])}
    for i in range(2):
        for kv in ("key", "value"):
            feed[f"past_key_values.{i}.{kv}"] = np.zeros((1, 2, 0, 8), bfloat16())
    out = dict(zip(session.output_names, session.run(None, feed)))
    assert out["present.0.key"].dtype == bfloat16() and out["logits"].dtype == np.float32


def test_bf16_loader_dtype_and_cli_choice(tmp_path):
    from wide_export.cli import app

    result = CliRunner().invoke(app, ["onnx", "--output", str(tmp_path / "o"), "--dtype", "bfloat8"])
    assert "bfloat16" in assert_one_line_error(result)


@pytest.mark.parametrize("flavour", ["--onnx"])
def test_triton_refuses_a_bf16_export_in_one_line(exports, tmp_path, flavour):
    from wide_export.cli import app

    result = CliRunner().invoke(app, ["triton", flavour, str(exports[0]), "--output", str(tmp_path / "repo")])
    line = assert_one_line_error(result)
    assert "bfloat16" in line and "--fp16" in line
    assert not (tmp_path / "repo").exists()


def test_mlp_bias_is_refused_in_one_line(tmp_path):
    from wide_export.cli import app

    folder = make_checkpoint(tmp_path / "ckpt", arch="llama", mlp_bias=True)
    result = CliRunner().invoke(app, ["onnx", "--model", str(folder), "--output", str(tmp_path / "o")])
    assert "mlp_bias" in assert_one_line_error(result)
