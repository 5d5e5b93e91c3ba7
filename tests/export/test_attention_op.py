"""`wide-export onnx --attention-op`: each routed layer's attention becomes one WideMaskedAttention node with its
function body, ONNX Runtime runs the graph to the logits and router decisions of the PyTorch reference (the
export's own verification), and the same as the export without the op; --tp refuses it in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.helpers import assert_one_line_error, make_checkpoint

SPEC = dict(arch="llama", num_heads=8, num_kv_heads=2, hidden_size=64, intermediate_size=96, attn_groups=4,
            ffn_groups=6)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from wide_export.checkpoint import Sources
    from wide_export.pipelines.onnx import export_and_verify

    root = tmp_path_factory.mktemp("attention-op")
    ckpt = make_checkpoint(root / "ckpt", num_layers=3, seed=5, **SPEC)
    runs = {}
    for flag in (True, False):
        out = root / ("with" if flag else "without")
        runs[flag] = (out, export_and_verify(Sources(ckpt), out, attention_op=flag, steps=2))
    return ckpt, runs


def test_each_routed_layer_has_one_attention_node_with_its_body(exports):
    _, runs = exports
    out, run = runs[True]
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    nodes = [n for n in model.graph.node if n.op_type == "WideMaskedAttention"]
    assert len(nodes) == 3 and all(n.domain == "wide" for n in nodes)
    assert [a.i for n in nodes for a in n.attribute if a.name == "group_heads"] == [2, 2, 2]
    assert "WideMaskedAttention" in {f.name for f in model.functions}
    assert run.result.wide_nodes["WideMaskedAttention"] == 3
    config = json.loads((out / "wide_config.json").read_text())
    assert config["op_set"]["ops"]["WideMaskedAttention"]["nodes"] == 3
    plain = onnx.load(str(runs[False][0] / "model.onnx"), load_external_data=False)
    assert not [n for n in plain.graph.node if n.op_type == "WideMaskedAttention"]
    assert "WideMaskedAttention" not in {f.name for f in plain.functions}  # its body only where it is used


def test_onnx_runtime_runs_it_to_the_reference_and_to_the_plain_export(exports):
    import onnxruntime as ort

    _, runs = exports
    for flag in (True, False):
        assert runs[flag][1].report.passed, runs[flag][1].report
    rng = np.random.default_rng(0)
    past, new, kv_heads, head_dim = 4, 5, SPEC["num_kv_heads"], SPEC["hidden_size"] // SPEC["num_heads"]
    feeds = {"input_ids": rng.integers(0, 200, (2, new)).astype(np.int64),
             "attention_mask": np.ones((2, past + new), np.int64),
             "position_ids": np.tile(np.arange(past, past + new), (2, 1)).astype(np.int64)}
    outs = {}
    for flag in (True, False):
        sess = ort.InferenceSession(str(runs[flag][0] / "model.onnx"), providers=["CPUExecutionProvider"])
        for i in sess.get_inputs():
            if i.name.startswith("past_key_values") and i.name not in feeds:
                feeds[i.name] = rng.standard_normal((2, kv_heads, past, head_dim)).astype(np.float32)
        outs[flag] = sess.run(["logits"], feeds)[0]
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)


def test_tp_refuses_it_in_one_line(exports, tmp_path):
    import subprocess
    import sys

    ckpt, _ = exports
    done = subprocess.run([sys.executable, "-c", "from wide_export.cli import main; main()", "onnx", "--model",
                           str(ckpt), "--output", str(tmp_path / "out"), "--attention-op", "--tp", "2"],
                          capture_output=True, text=True, timeout=300)
    line = assert_one_line_error(done)
    assert "--attention-op" in line and "--tp" in line
    assert not (tmp_path / "out").exists()
