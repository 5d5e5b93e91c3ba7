"""export/verify_onnx.py's pieces (and those it shares: verify/common.py, export/session.py) without an export: which reference it builds from what, when the
whole-graph check would not fit (by hand from file sizes and MemAvailable), the masks added as outputs,
the graph-file checks, the model-shape check, the per-layer bookkeeping and the chained summary line."""

from __future__ import annotations

import types

import numpy as np
import pytest

from wide_export.base.errors import WideError
from wide_export.export import session as export_session
from wide_export.verify import common
from wide_export.export import verify_onnx as ov
from wide_export.pipelines import verify as pv
from wide_export.verify.reference import Step
from wide_export.verify.tolerances import Tolerance

ATTN0 = "/model/layers.0/router_attention/mask"
FFN0 = "/model/layers.0/router_ffn/mask"
FFN1 = "/model/layers.1/router_ffn/mask"


# -- which reference
def _sources(tmp_path, lora=True):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "router.pth").write_bytes(b"")
    src = {"config": {"path": str(tmp_path / "m" / "config.json")}, "router": {"path": str(tmp_path / "router.pth")}}
    if lora:
        src["lora"] = {"path": str(tmp_path / "lora.pth")}
    return src


def test_recorded_sources_name_the_checkpoint_router_and_lora(tmp_path):
    got = common._recorded_sources({"sources": _sources(tmp_path), "lora_scale": 1.5})
    assert got == {"model_dir": tmp_path / "m", "router": tmp_path / "router.pth", "lora": tmp_path / "lora.pth",
                   "lora_scale": 1.5}
    (tmp_path / "b").mkdir()
    got = common._recorded_sources({"sources": _sources(tmp_path / "b", lora=False)})
    assert got["lora"] is None and got["lora_scale"] == 2.0  # the default scale without one recorded


def test_recorded_sources_refusals(tmp_path):
    with pytest.raises(WideError, match="^wide_config.json .*checkpoint") as err:
        common._recorded_sources({"sources": {"config": {"path": "/x/config.json"}}})
    assert "--model" in err.value.hint
    with pytest.raises(WideError, match="does not say which checkpoint"):
        common._recorded_sources({})
    src = _sources(tmp_path)
    (tmp_path / "router.pth").unlink()
    with pytest.raises(WideError, match=f"no longer at {tmp_path / 'm'}") as err:
        common._recorded_sources({"sources": src})
    assert err.value.message.endswith(f" {tmp_path / 'm'}") and "--model" in err.value.hint
    src["config"]["path"] = str(tmp_path / "gone" / "config.json")
    (tmp_path / "router.pth").write_bytes(b"")
    with pytest.raises(WideError, match="no longer at"):
        common._recorded_sources({"sources": src})


class _FakeLoaded:
    def __init__(self, weights=None, dtype="torch.float32"):
        self.weights = weights
        self.model = types.SimpleNamespace(dtype=dtype, name="eager")


def test_reference_for_reuses_a_float32_eager_model_and_loads_otherwise(tmp_path, monkeypatch):
    import wide_export.checkpoint as checkpoint

    calls = []

    def load(**kw):
        calls.append(kw)
        return _FakeLoaded(weights="lazy" if kw.get("lazy") else None)

    monkeypatch.setattr(checkpoint, "load_wide_model", load)
    monkeypatch.setattr(common, "streamed", lambda loaded: ("streamed", loaded.weights))
    given = _FakeLoaded()
    assert common.reference_for({}, given) is given.model
    assert calls == []
    # a float16 model or a lazy one is not the float32 reference: load from the given folder
    out = common.reference_for({}, _FakeLoaded(dtype="torch.float16"), model_dir=tmp_path)
    assert out.name == "eager"
    assert calls[-1] == {"dtype": "float32", "checksums": False, "lazy": False, "model_dir": tmp_path}
    common.reference_for({}, _FakeLoaded(weights="w"), model_dir=tmp_path)
    assert calls[-1]["model_dir"] == tmp_path
    # lazy: the streamed reference
    assert common.reference_for({"demo": True}, None, lazy=True, demo=True) == ("streamed", "lazy")
    assert calls[-1] == {"dtype": "float32", "checksums": False, "lazy": True, "demo": True}
    # neither a folder nor the demo: the recorded sources
    common.reference_for({"sources": _sources(tmp_path)})
    assert calls[-1]["model_dir"] == tmp_path / "m" and calls[-1]["router"] == tmp_path / "router.pth"
    assert calls[-1]["lazy"] is False and calls[-1]["dtype"] == "float32"


# -- memory
def _files(tmp_path, model_bytes, data_bytes):
    (tmp_path / "model.onnx").write_bytes(b"\0" * model_bytes)
    files = {"model": "model.onnx"}
    if data_bytes is not None:
        (tmp_path / "model.onnx.data").write_bytes(b"\0" * data_bytes)
        files["external_data"] = "model.onnx.data"
    return files


@pytest.mark.parametrize("dtype, available, sliced", [
    # float16: stored 1000 + 4000 = 5000 bytes, the float32 reference twice that: 15000 needed
    ("float16", 25000, False),  # 15000 <= 0.6 * 25000
    ("float16", 24999, True),
    ("bfloat16", 24999, True),
    # float32: the reference is as large as the export: 10000 needed
    ("float32", 16667, False),
    ("float32", 16666, True),
    ("float32", None, False),  # the kernel does not say: the whole graph
])
def test_needs_slices_by_hand(tmp_path, monkeypatch, dtype, available, sliced):
    monkeypatch.setattr(ov, "_available_memory", lambda: available)
    files = _files(tmp_path, 1000, 4000)
    assert ov.needs_slices(tmp_path, {"files": files, "dtype": dtype}) is sliced


def test_needs_slices_without_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(ov, "_available_memory", lambda: 10000)
    files = _files(tmp_path, 3000, None)  # 3000 + 6000 = 9000 > 6000
    assert ov.needs_slices(tmp_path, {"files": {**files, "external_data": None}, "dtype": "float16"}) is True
    assert ov.needs_slices(tmp_path, {"files": files, "dtype": "float32"}) is False  # 6000 <= 6000


class _Meminfo:
    def __init__(self, text=None, error=None):
        self.text, self.error = text, error

    def __call__(self, path):
        assert str(path) == "/proc/meminfo"
        return self

    def read_text(self):
        if self.error:
            raise self.error
        return self.text


@pytest.mark.parametrize("meminfo, expected", [
    (_Meminfo("MemTotal:  100 kB\nMemFree:  10 kB\nMemAvailable:   2048 kB\n"), 2048 * 1024),
    (_Meminfo("MemTotal:  100 kB\n"), None),
    (_Meminfo("MemAvailable: lots\n"), None),
    (_Meminfo("MemAvailable:\n"), None),
    (_Meminfo(error=OSError("no /proc")), None),
])
def test_available_memory_from_meminfo(monkeypatch, meminfo, expected):
    monkeypatch.setattr(ov, "Path", meminfo)
    assert ov._available_memory() == expected


def test_available_memory_on_this_machine_is_positive():
    value = ov._available_memory()
    assert value is None or value > 0


# -- the graph
def _graph_dir(tmp_path, external=False):
    """x -> Relu -> named like a router mask -> Cast -> logits; the mask is not a graph output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Add", ["x", "b"], ["xb"], name="/model/layers.0/Add"),
             helper.make_node("Greater", ["xb", "zero"], ["gt"], name="/model/layers.0/router_ffn/Greater"),
             helper.make_node("Cast", ["gt"], [FFN0], to=TensorProto.INT32, name="/model/layers.0/router_ffn/Cast"),
             helper.make_node("Cast", [FFN0], ["logits"], to=TensorProto.FLOAT, name="/lm_head/Cast")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
                              initializer=[numpy_helper.from_array(np.array([0.5, -2.0, 1.0], np.float32), "b"),
                                           numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if external:
        onnx.save_model(model, str(tmp_path / "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    else:
        onnx.save_model(model, str(tmp_path / "model.onnx"))
    layers = [{"attention": None, "ffn": {"mask": FFN0}}, {"attention": {"mask": ATTN0}, "ffn": None}]
    return {"files": {"model": "model.onnx"}, "layers": layers}


def test_with_masks_adds_each_router_mask_once_as_an_int32_output(tmp_path):
    import onnx

    config = _graph_dir(tmp_path)
    proto = export_session.with_masks(tmp_path, config)
    outs = [(o.name, o.type.tensor_type.elem_type) for o in proto.graph.output]
    assert outs == [("logits", onnx.TensorProto.FLOAT), (FFN0, onnx.TensorProto.INT32),
                    (ATTN0, onnx.TensorProto.INT32)]
    # an output the graph already has is not added twice
    config["layers"].append({"attention": None, "ffn": {"mask": "logits"}})
    assert [o.name for o in export_session.with_masks(tmp_path, config).graph.output] == ["logits", FFN0, ATTN0]


@pytest.mark.parametrize("external", [False, True])
def test_debug_session_runs_the_graph_with_its_masks(tmp_path, external):
    config = _graph_dir(tmp_path, external=external)
    config["layers"] = config["layers"][:1]
    session = export_session.debug_session(tmp_path, config)
    logits, mask = session.run(["logits", FFN0], {"x": np.array([[0.0, 1.0, -2.0]], np.float32)})
    assert mask.tolist() == [[1, 0, 0]] and mask.dtype == np.int32  # x + b > 0, by hand
    assert logits.tolist() == [[1.0, 0.0, 0.0]]
    # a serialized graph of the caller's instead of with_masks()
    only = export_session.debug_session(tmp_path, config, (tmp_path / "model.onnx").read_bytes())
    assert [o.name for o in only.get_outputs()] == ["logits"]


def test_debug_session_asks_for_no_provider_onnxruntime_lacks(tmp_path):
    """Opening the session warns about nothing: the CPU provider it asks for is one ONNX Runtime has."""
    import warnings

    config = _graph_dir(tmp_path)
    config["layers"] = config["layers"][:1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = export_session.debug_session(tmp_path, config)
    assert [str(w.message) for w in caught] == []
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_check_graph_files_refuses_weights_outside_the_folder(tmp_path):
    import onnx

    config = _graph_dir(tmp_path, external=True)
    export_session.check_graph_files(tmp_path, config)  # fine as written
    proto = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save_model(proto, str(tmp_path / "model.onnx"))
    with pytest.raises(WideError):
        export_session.check_graph_files(tmp_path, config)
    (tmp_path / "model.onnx").write_bytes(b"not a graph")
    with pytest.raises(WideError, match="is not a readable ONNX model"):
        export_session.check_graph_files(tmp_path, config)


def test_session_for_a_slice_follows_the_dtype(tmp_path):
    from wide_export.verify.evaluator import EvaluatorSession

    config = _graph_dir(tmp_path)
    config["layers"] = config["layers"][:1]
    proto = export_session.with_masks(tmp_path, config)
    assert isinstance(ov._session(tmp_path, {**config, "dtype": "bfloat16"}, proto), EvaluatorSession)
    session = ov._session(tmp_path, {**config, "dtype": "float16"}, proto)
    assert not isinstance(session, EvaluatorSession)
    assert FFN0 in [o.name for o in session.get_outputs()]


def test_a_bfloat16_slice_reads_its_external_weights_from_the_export(tmp_path, monkeypatch):
    """A bf16 slice session (the reference evaluator) finds the weights in the export folder, wherever the
    process runs: x + b > 0 by hand."""
    config = _graph_dir(tmp_path, external=True)
    config["layers"] = config["layers"][:1]
    proto = export_session.with_masks(tmp_path, config)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    session = ov._session(tmp_path, {**config, "dtype": "bfloat16"}, proto)
    logits, mask = session.run(["logits", FFN0], {"x": np.array([[0.0, 1.0, -2.0]], np.float32)})
    assert mask.tolist() == [[1, 0, 0]] and logits.tolist() == [[1.0, 0.0, 0.0]]


# -- the model check
def _model(**over):
    cfg = dict(num_layers=2, hidden_size=32, vocab_size=64, num_key_value_heads=2, head_dim=8)
    cfg.update(over)
    return types.SimpleNamespace(config=types.SimpleNamespace(**cfg))


def test_check_same_model_names_the_first_difference():
    export = dict(num_layers=2, hidden_size=32, vocab_size=64, num_key_value_heads=2, head_dim=8)
    common.check_same_model(_model(), export)
    for key, wrong in [("num_layers", 3), ("hidden_size", 16), ("vocab_size", 65), ("num_key_value_heads", 1),
                       ("head_dim", 4)]:
        with pytest.raises(WideError, match=f"{key}={wrong} ") as err:
            common.check_same_model(_model(**{key: wrong}), export)
        assert err.value.message.endswith(f" {export[key]}"), err.value.message  # the export's value
        assert "--model" in err.value.hint and "--router" in err.value.hint
    with pytest.raises(WideError, match="head_dim=8 but the export has None"):
        common.check_same_model(_model(), {k: v for k, v in export.items() if k != "head_dim"})


# -- per-layer bookkeeping
def test_layer_outputs_are_the_stream_entering_each_next_layer():
    hidden = [np.full(2, float(i)) for i in range(4)]  # entering layer 0, 1, 2, then the head
    step = Step(feed={"x": 1}, ref={"logits": np.zeros(1)}, margins={"m": np.ones(1)}, hidden=hidden)
    out = ov._with_layer_outputs(step)
    assert sorted(out.ref) == ["layer_output.0", "layer_output.1", "layer_output.2", "logits"]
    assert [out.ref[f"layer_output.{i}"][0] for i in range(3)] == [1.0, 2.0, 3.0]
    assert out.feed is step.feed and out.margins is step.margins and out.hidden is step.hidden
    assert sorted(step.ref) == ["logits"]  # the step itself is unchanged


def test_presents_are_only_the_present_tensors():
    ref = {"logits": 1, "present.0.key": 2, "present.0.value": 3, "/model/layers.0/router_ffn/mask": 4,
           "layer_output.0": 5}
    assert ov._presents(ref) == {"present.0.key": 2, "present.0.value": 3}


def _chain_case(flip: bool, shift: float):
    ref = {"logits": np.array([[1.0, 2.0, 4.0, 8.0]], np.float32), FFN0: np.ones((1, 1, 4), np.int32),
           FFN1: np.ones((1, 1, 4), np.int32)}
    got = {k: v.copy() for k, v in ref.items()}
    got["logits"][0, 2] += shift
    if flip:
        got[FFN1][0, 0, 1] = 0
    margins = {FFN0: np.full((1, 1, 4), 9.0, np.float32), FFN1: np.full((1, 1, 4), 9.0, np.float32)}
    return [Step(feed={}, ref=ref, margins=margins)], [got]


def test_chained_summary_within_tolerance():
    tol = Tolerance(atol=0.1, rtol=0.0, stat="elemwise", min_agreement=0.5, flip_margin=0.1)
    line = ov._chained_summary(*_chain_case(False, 0.05), tol)
    assert line == ("per-layer check (the verdict): each layer and the head ran on the reference's residual stream "
                    "and past; chained through all slices as the whole graph runs, logits max |abs| 5.00e-02 "
                    "(mean 1.25e-02), 0 router flips, within tolerance")


def test_chained_summary_names_the_first_router_out_of_tolerance():
    tol = Tolerance(atol=0.1, rtol=0.0, stat="elemwise", min_agreement=0.5, flip_margin=0.1)
    line = ov._chained_summary(*_chain_case(True, 0.0), tol)
    assert line.endswith(f"logits max |abs| 0.00e+00 (mean 0.00e+00), 1 router flips, OUT OF tolerance; "
                         f"first router out of tolerance: {FFN1}")


# -- pipelines.verify.verify_onnx: a TP folder to the TP verification, refusals before any work
def test_sliced_verification_of_a_tp_export_is_refused(tmp_path):
    from wide_export.tp.plan import MANIFEST

    (tmp_path / MANIFEST).write_text("{}")
    with pytest.raises(WideError, match="^--sliced ") as err:
        pv.verify_onnx(tmp_path, sliced=True)
    assert "--sliced" in err.value.hint and "--tp" in err.value.hint


def test_tp_exports_go_to_the_tp_verification(tmp_path, monkeypatch):
    import wide_export.tp.verify as tpv
    from wide_export.tp.plan import MANIFEST

    (tmp_path / MANIFEST).write_text("{}")
    seen = {}
    monkeypatch.setattr(tpv, "verify_tp", lambda folder, **kw: seen.update(folder=folder, **kw) or "tp-report")
    assert pv.verify_onnx(tmp_path, report_path=tmp_path / "r.json", batch=1, load_kwargs={"model_dir": "m"}) \
        == "tp-report"
    assert seen["folder"] == tmp_path and seen["report_path"] == tmp_path / "r.json" and seen["batch"] == 1
    assert seen["load_kwargs"] == {"model_dir": "m"}
    assert seen["loaded"] is None and seen["stages"] is None
    # the caller's model and progress go to the TP verification as they are
    loaded, stages = object(), object()
    pv.verify_onnx(tmp_path, loaded=loaded, stages=stages)
    assert seen["loaded"] is loaded and seen["stages"] is stages


def test_quiet_polygraphy_keeps_errors_only():
    from polygraphy.logger import G_LOGGER

    keep = G_LOGGER.module_severity
    try:
        common.quiet_polygraphy()
        severity = G_LOGGER.module_severity
        level = severity.get() if hasattr(severity, "get") else severity
        assert level == G_LOGGER.ERROR
    finally:
        G_LOGGER.module_severity = keep


def test_one_defaults_table_for_every_target():
    """verify/common.with_defaults: a given value wins, None keeps the default, an unknown setting is refused
    (it would otherwise be dropped silently by one target and fail in another)."""
    assert common.with_defaults({}) == common.DEFAULTS == {"batch": 2, "prompt_len": 7, "steps": 3, "seed": 0}
    assert common.with_defaults({"batch": 5, "steps": None}) == {"batch": 5, "prompt_len": 7, "steps": 3, "seed": 0}
    with pytest.raises(TypeError, match=r"\['stepz'\]"):
        common.with_defaults({"stepz": 1})
    import wide_export.tp.verify as sharded
    import wide_export.trt.verify as tensorrt

    assert not hasattr(tensorrt, "DEFAULTS") and not hasattr(sharded, "DEFAULTS")
