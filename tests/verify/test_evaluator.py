"""verify/evaluator.py: onnx's reference evaluator behind an ONNX Runtime session's and a Polygraphy
runner's faces, with external weights, bf16 rounding as the graph asks for it (checked with ml_dtypes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from wide_export.verify.evaluator import EvaluatorRunner, EvaluatorSession, bfloat16, is_float

W = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)


def _model():
    """y = x @ W, z = bf16(y) + bf16(1/3) back in float32 (W is large enough to be stored outside)."""
    from onnx import TensorProto, helper, numpy_helper

    third = numpy_helper.from_array(np.array([1 / 3], np.float32), "third")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]),
             helper.make_node("Cast", ["y"], ["yb"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["third"], ["tb"], to=TensorProto.BFLOAT16),
             helper.make_node("Add", ["yb", "tb"], ["zb"]),
             helper.make_node("Cast", ["zb"], ["z"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2])],
                              initializer=[numpy_helper.from_array(W, "W"), third])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


X = np.array([[0.1, 1.7]], np.float32)


def _by_hand():
    y = X @ W
    b = np.dtype(ml_dtypes.bfloat16)
    z = (y.astype(b) + np.array([1 / 3], np.float32).astype(b)).astype(np.float32)
    return y, z


def test_dtype_helpers():
    assert bfloat16() == np.dtype(ml_dtypes.bfloat16)
    assert is_float(np.float16) and is_float(np.float32) and is_float("float64")
    assert is_float(np.dtype(ml_dtypes.bfloat16))
    assert not is_float(np.int32) and not is_float(np.bool_) and not is_float(np.int64)


def test_session_runs_the_graph_with_bf16_rounding_where_it_asks():
    session = EvaluatorSession(_model())
    y, z = _by_hand()
    assert session.output_names == ["y", "z"]
    got_y, got_z = session.run(None, {"x": X})
    assert isinstance(got_z, np.ndarray)
    np.testing.assert_allclose(got_y, y, rtol=1e-6)
    assert np.array_equal(got_z, z)  # bf16 rounding of y and of 1/3, then a bf16 add
    assert not np.array_equal(got_z, y + np.float32(1 / 3))  # the rounding is visible
    (only_z,) = session.run(["z"], {"x": X})
    assert np.array_equal(only_z, z)


def test_session_reads_external_weights_from_the_given_folder(tmp_path):
    import onnx

    onnx.save_model(_model(), str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=0)
    proto = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    session = EvaluatorSession(proto, tmp_path)
    np.testing.assert_allclose(session.run(["y"], {"x": X})[0], _by_hand()[0], rtol=1e-6)
    # the caller's proto keeps its weights outside (a copy was loaded)
    from onnx.external_data_helper import uses_external_data

    assert all(uses_external_data(t) for t in proto.graph.initializer)
    with pytest.raises(Exception):  # noqa: B017 - without the folder the weights are not there
        EvaluatorSession(proto, tmp_path / "elsewhere").run(None, {"x": X})


def test_a_graph_with_inline_weights_needs_no_folder(tmp_path):
    session = EvaluatorSession(_model(), tmp_path / "never-read")
    assert np.array_equal(session.run(["z"], {"x": X})[0], _by_hand()[1])


def test_runner_face_names_outputs_and_is_a_context_manager():
    runner = EvaluatorRunner(EvaluatorSession(_model()))
    assert runner.name == "onnx-reference"
    with runner as entered:
        assert entered is runner
        out = runner.infer({"x": X})
    assert list(out) == ["y", "z"]
    assert np.array_equal(out["z"], _by_hand()[1])
    assert runner.__exit__(ValueError, ValueError("x"), None) is False  # exceptions are not swallowed
