"""fp16 conversion of a float32 export (wide_export/export/fp16.py), compared with what the
fp16 export itself writes (`wide-export onnx --dtype float16`) and with the PyTorch reference."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx.shape_inference import infer_shapes

from wide_export.errors import WideError
from wide_export.export.fp16 import convert_export


@pytest.fixture(scope="module")
def fp16_export(tmp_path_factory):
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx

    out = tmp_path_factory.mktemp("fp16") / "onnx"
    export_onnx(load_wide_model(None, dtype="float16"), out)
    return out


@pytest.fixture(scope="module")
def converted(demo_onnx, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted")
    convert_export(demo_onnx, out)
    return out


def _types(folder):
    """node name -> (input elem types, output elem types), from ONNX shape inference."""
    model = infer_shapes(onnx.load(str(folder / "model.onnx")))
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    nodes = {n.name: ([types.get(i) for i in n.input], [types.get(o) for o in n.output]) for n in g.node}
    io = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output]}
    fp32_weights = {t.name for t in g.initializer if t.data_type == onnx.TensorProto.FLOAT}
    wide = {n.name for n in g.node if n.domain == "wide"}
    return nodes, io, fp32_weights, wide


def test_converted_graph_has_the_types_of_the_fp16_export(converted, fp16_export):
    _assert_same_types(converted, fp16_export)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # q/k/v biases; per-head q_norm/k_norm
def test_other_architectures_convert_like_their_fp16_export(arch, tmp_path):
    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx
    from wide_export.verify.onnx_verify import verify_onnx

    folder = make_checkpoint(tmp_path / "ckpt", arch=arch, head_dim=16 if arch == "qwen3" else None)
    export_onnx(load_wide_model(folder, dtype="float32"), tmp_path / "f32")
    export_onnx(load_wide_model(folder, dtype="float16"), tmp_path / "f16")
    (tmp_path / "conv").mkdir()
    convert_export(tmp_path / "f32", tmp_path / "conv")
    _assert_same_types(tmp_path / "conv", tmp_path / "f16")
    report = verify_onnx(tmp_path / "conv", steps=2)
    assert report.dtype == "float16" and report.passed, report.to_dict()


def _assert_same_types(converted, fp16_export):
    got_nodes, got_io, got_fp32, got_wide = _types(converted)
    want_nodes, want_io, want_fp32, want_wide = _types(fp16_export)
    assert got_io == want_io  # KV cache float16, logits float32, ids int64
    assert got_io["logits"] == onnx.TensorProto.FLOAT and got_io["present.0.key"] == onnx.TensorProto.FLOAT16
    assert got_fp32 == want_fp32 and any("router" in n for n in got_fp32)  # router weights stay float32
    assert got_wide == want_wide
    # Node by node (the names follow the module tree in both): same input and output types.
    # Cast nodes are where the two graphs legitimately differ (and their names collide).
    common = [n for n in set(got_nodes) & set(want_nodes) if not n.rsplit("/", 1)[-1].startswith("Cast")]
    assert len(common) > 0.8 * len(want_nodes)
    differ = {n: (got_nodes[n], want_nodes[n]) for n in common if got_nodes[n] != want_nodes[n]}
    assert not differ


def test_converted_graph_passes_the_fp16_verification(converted):
    from wide_export.verify.onnx_verify import verify_onnx
    from wide_export.verify.tolerances import tolerance_for

    config = json.loads((converted / "wide_config.json").read_text())
    assert config["dtype"] == "float16" and config["fp16_conversion"]["from"] == "float32"
    report = verify_onnx(converted, steps=3)
    assert report.dtype == "float16" and report.tolerance == tolerance_for("float16").to_dict()
    assert report.passed, report.to_dict()


def test_an_fp16_export_is_not_converted_again(fp16_export, tmp_path):
    with pytest.raises(WideError, match="only a float32 one"):
        convert_export(fp16_export, tmp_path)
