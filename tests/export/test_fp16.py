"""fp16 conversion of a float32 export (wide_export/export/fp16.py), compared with what the
fp16 export itself writes (`wide-export onnx --dtype float16`) and with the PyTorch reference."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx.shape_inference import infer_shapes

from wide_export.base.errors import WideError
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
    from wide_export.pipelines.verify import verify_onnx

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
    from wide_export.pipelines.verify import verify_onnx
    from wide_export.verify.tolerances import tolerance_for

    config = json.loads((converted / "wide_config.json").read_text())
    assert config["dtype"] == "float16" and config["fp16_conversion"]["from"] == "float32"
    report = verify_onnx(converted, steps=3)
    assert report.dtype == "float16" and report.tolerance == tolerance_for("float16").to_dict()
    assert report.passed, report.to_dict()


def test_an_fp16_export_is_not_converted_again(fp16_export, tmp_path):
    with pytest.raises(WideError, match="only a float32 one"):
        convert_export(fp16_export, tmp_path)


def test_values_fp16_cannot_hold_are_counted_not_warned_per_tensor(demo_onnx, tmp_path):
    """The converter warned once per tensor ('the float32 number ... will be truncated'),
    naming neither tensor nor count. Now: no such warning; wide_config.json counts what was clamped in the
    tensors the conversion turned into fp16 (a router weight stays float32, so its big value is not
    clamped and not counted); trt's one line names the tensor where it matters."""
    import shutil
    import warnings

    import numpy as np
    from onnx import numpy_helper

    src = tmp_path / "f32"
    shutil.copytree(demo_onnx, src)
    model = onnx.load(str(src / "model.onnx"))
    wide_inputs = {n.op_type: n.input for n in model.graph.node if n.domain == "wide"}
    inits = {t.name: t for t in model.graph.initializer}
    gemm_w = next(i for i in wide_inputs["WideMaskedGemmK"] if i in inits and len(inits[i].dims) == 2)
    router_w = next(i for i in wide_inputs["WideRouter"] if i in inits and len(inits[i].dims) == 2)
    for name, values in ((gemm_w, [1e5, -2e5, 7e4, 1e-9, -3e-10]), (router_w, [1e6])):
        a = numpy_helper.to_array(inits[name]).copy()
        a.flat[[0, 5, 9, 11, 13][:len(values)]] = values
        inits[name].CopyFrom(numpy_helper.from_array(a, name))
    onnx.save(model, str(src / "model.onnx"))
    (tmp_path / "conv").mkdir()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        config = convert_export(src, tmp_path / "conv")
    assert not [w for w in seen if "will be truncated" in str(w.message)]
    clamped = config["fp16_conversion"]["clamped"]
    assert clamped["above_fp16_range"] == 3 and clamped["above_fp16_range_tensors"] == [f"initializer {gemm_w}"]
    assert clamped["below_fp16_subnormal"] >= 2  # ours, and any the random weights had
    assert json.loads((tmp_path / "conv" / "wide_config.json").read_text())["fp16_conversion"]["clamped"] == clamped
    out = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "conv" / "model.onnx")).graph.initializer}
    assert out[gemm_w].dtype == np.float16 and out[gemm_w].flat[0] == 65504 and out[gemm_w].flat[5] == -65504
    assert out[router_w].dtype == np.float32 and out[router_w].flat[0] == 1e6
    from wide_export.export.fp16 import clamp_note

    note = clamp_note(config)
    assert note.startswith("warning: 3 values beyond fp16's range") and gemm_w in note and "\n" not in note
    assert clamp_note({"fp16_conversion": {"clamped": {"above_fp16_range": 0, "above_fp16_range_tensors": [],
                                                       "below_fp16_subnormal": 900}}}) is None
