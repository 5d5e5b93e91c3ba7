"""verify_onnx in-process on a tiny float32 export (tests/verify/conftest.py): whole graph and sliced, the
report's contents and file, settings, the automatic choice, a failing verdict and a wrong reference."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_checkpoint
from tests.verify.conftest import SPEC


def _kw(ckpt):
    return {"model_dir": ckpt, "router": ckpt / "router.pth"}


def test_whole_graph_verification_report(tiny, tmp_path):
    from wide_export.verify.onnx_verify import DEFAULTS, verify_onnx
    from wide_export.verify.tolerances import tolerance_for

    ckpt, folder = tiny
    path = tmp_path / "r" / "verify.json"
    report = verify_onnx(folder, load_kwargs=_kw(ckpt), report_path=path, sliced=False, prompt_len=None, steps=1)
    assert report.passed is True
    assert report.target == "onnxruntime" and report.dtype == "float32"
    assert report.tolerance == tolerance_for("float32").to_dict()
    assert report.settings == {**DEFAULTS, "steps": 1, "sliced": False}  # None keeps the default
    assert DEFAULTS == {"batch": 2, "prompt_len": 7, "steps": 3, "seed": 0}
    names = [r.name for r in report.outputs]
    assert names == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert [r.mask for r in report.decisions] == [f"/model/layers.{i}/router_{k}/mask" for i in range(2)
                                                  for k in ("attention", "ffn")]
    # batch 2, 7 prompt tokens + 1 decode step; 4 attention groups (heads), 12 FFN groups
    assert [r.decisions for r in report.decisions] == [2 * 8 * 4, 2 * 8 * 12] * 2
    assert report.notes == []
    saved = json.loads(path.read_text())
    assert saved["passed"] is True and saved["settings"]["steps"] == 1 and len(saved["outputs"]) == 5


def test_sliced_verification_checks_each_layer_and_says_so(tiny):
    from wide_export.verify.onnx_verify import verify_onnx

    ckpt, folder = tiny
    report = verify_onnx(folder, load_kwargs=_kw(ckpt), sliced=True, batch=1, steps=1, prompt_len=3)
    assert report.passed is True and report.settings["sliced"] is True and report.settings["batch"] == 1
    names = [r.name for r in report.outputs]
    assert names[0] == "logits" and {"layer_output.0", "layer_output.1"} <= set(names)
    assert len(report.notes) == 2
    assert report.notes[0].startswith("ONNX Runtime ran the graph in 4 slices")
    assert report.notes[1].startswith("per-layer check (the verdict)") and "within tolerance" in report.notes[1]
    assert [r.decisions for r in report.decisions] == [1 * 4 * 4, 1 * 4 * 12] * 2


def test_the_automatic_choice_slices_when_memory_is_short(tiny, monkeypatch):
    from wide_export.verify import onnx_verify

    ckpt, folder = tiny
    asked = []
    monkeypatch.setattr(onnx_verify, "needs_slices", lambda onnx_dir, config: asked.append((onnx_dir, config)) or True)
    report = onnx_verify.verify_onnx(folder, load_kwargs=_kw(ckpt), batch=1, steps=0, prompt_len=2)
    assert report.settings["sliced"] is True and report.notes[0].startswith("ONNX Runtime ran the graph in")
    assert asked[0][0] == folder and asked[0][1]["dtype"] == "float32"  # the export folder and its config
    monkeypatch.setattr(onnx_verify, "needs_slices", lambda onnx_dir, config: False)
    report = onnx_verify.verify_onnx(folder, load_kwargs=_kw(ckpt), batch=1, steps=0, prompt_len=2)
    assert report.settings["sliced"] is False and report.notes == []


def test_a_tolerance_no_export_meets_fails_the_verdict(tiny, monkeypatch, tmp_path):
    from wide_export.verify import onnx_verify
    from wide_export.verify.tolerances import Tolerance

    ckpt, folder = tiny
    strict = Tolerance(atol=0.0, rtol=0.0, stat="max", min_agreement=1.0, flip_margin=0.0)
    monkeypatch.setattr(onnx_verify, "tolerance_for", lambda dtype: strict)
    path = tmp_path / "verify.json"
    report = onnx_verify.verify_onnx(folder, load_kwargs=_kw(ckpt), report_path=path, sliced=False, batch=1,
                                     steps=0, prompt_len=2)
    assert report.passed is False and report.tolerance == strict.to_dict()
    assert json.loads(path.read_text())["passed"] is False  # written even when failing


def test_the_wrong_reference_is_refused_before_comparing(tiny, tmp_path):
    from wide_export.errors import WideError
    from wide_export.verify.onnx_verify import verify_onnx

    _, folder = tiny
    other = make_checkpoint(tmp_path / "other", **{**SPEC, "num_layers": 3})
    with pytest.raises(WideError, match="the reference model has num_layers=3 but the export has 2"):
        verify_onnx(folder, load_kwargs=_kw(other), sliced=False)
