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
    from wide_export.verify.common import DEFAULTS
    from wide_export.pipelines.verify import verify_onnx
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
    from wide_export.pipelines.verify import verify_onnx

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
    from wide_export.export import verify_onnx as onnx_verify

    ckpt, folder = tiny
    asked = []
    monkeypatch.setattr(onnx_verify, "needs_slices", lambda onnx_dir, config: asked.append((onnx_dir, config)) or True)
    report = onnx_verify.verify_graph(folder, load_kwargs=_kw(ckpt), batch=1, steps=0, prompt_len=2)
    assert report.settings["sliced"] is True and report.notes[0].startswith("ONNX Runtime ran the graph in")
    assert asked[0][0] == folder and asked[0][1]["dtype"] == "float32"  # the export folder and its config
    monkeypatch.setattr(onnx_verify, "needs_slices", lambda onnx_dir, config: False)
    report = onnx_verify.verify_graph(folder, load_kwargs=_kw(ckpt), batch=1, steps=0, prompt_len=2)
    assert report.settings["sliced"] is False and report.notes == []


def test_a_tolerance_no_export_meets_fails_the_verdict(tiny, monkeypatch, tmp_path):
    from wide_export.export import verify_onnx as onnx_verify
    from wide_export.verify.tolerances import Tolerance

    ckpt, folder = tiny
    strict = Tolerance(atol=0.0, rtol=0.0, stat="max", min_agreement=1.0, flip_margin=0.0)
    monkeypatch.setattr(onnx_verify, "tolerance_for", lambda dtype: strict)
    path = tmp_path / "verify.json"
    report = onnx_verify.verify_graph(folder, load_kwargs=_kw(ckpt), report_path=path, sliced=False, batch=1,
                                     steps=0, prompt_len=2)
    assert report.passed is False and report.tolerance == strict.to_dict()
    assert json.loads(path.read_text())["passed"] is False  # written even when failing


def test_the_wrong_reference_is_refused_before_comparing(tiny, tmp_path):
    from wide_export.base.errors import WideError
    from wide_export.pipelines.verify import verify_onnx

    _, folder = tiny
    other = make_checkpoint(tmp_path / "other", **{**SPEC, "num_layers": 3})
    with pytest.raises(WideError, match="num_layers=3 ") as err:
        verify_onnx(folder, load_kwargs=_kw(other), sliced=False)
    assert err.value.message.endswith(" 2"), err.value.message  # the export's num_layers


class _Recorded:
    """A quiet Stages that keeps the stage names, in order, and the progress lines under them."""

    def __init__(self):
        from wide_export.base.progress import Stages

        self.stages = Stages(quiet=True)
        self.names, self.updates = [], []

    def stage(self, name):
        self.names.append(name)
        return self.stages.stage(name)

    def update(self, message):
        self.updates.append(message)


def test_the_stages_are_named_for_what_runs(tiny):
    """Whole graph: `reference` then `onnxrt`; sliced: the same names, with progress lines under the second."""
    from wide_export.pipelines.verify import verify_onnx

    ckpt, folder = tiny
    whole = _Recorded()
    verify_onnx(folder, load_kwargs=_kw(ckpt), stages=whole, sliced=False, batch=1, steps=0, prompt_len=2)
    assert whole.names == ["reference", "onnxrt"] and whole.updates == []
    sliced = _Recorded()
    verify_onnx(folder, load_kwargs=_kw(ckpt), stages=sliced, sliced=True, batch=1, steps=0, prompt_len=2)
    assert sliced.names == ["reference", "onnxrt"]
    assert sliced.updates and all(isinstance(u, str) and u for u in sliced.updates)


def test_without_stages_nothing_is_printed(tiny, capsys):
    """The library call is quiet unless the caller passes its own Stages (the CLI does)."""
    from wide_export.pipelines.verify import verify_onnx

    ckpt, folder = tiny
    verify_onnx(folder, load_kwargs=_kw(ckpt), sliced=False, batch=1, steps=0, prompt_len=2)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_without_load_arguments_the_recorded_checkpoint_is_the_reference(tiny):
    """No --model: the checkpoint wide_config.json records (the fixture's own) is loaded and passes."""
    from wide_export.pipelines.verify import verify_onnx

    _, folder = tiny
    report = verify_onnx(folder, sliced=False, batch=1, steps=0, prompt_len=2)
    assert report.passed is True and report.target == "onnxruntime"


def test_a_given_float32_model_is_the_reference_and_load_arguments_are_unused(tiny, tmp_path):
    """`loaded` (a float32 eager model) is used as it is: load arguments naming another checkpoint
    (3 layers, which the export would refuse) are not read then."""
    from wide_export.checkpoint import load_wide_model
    from wide_export.pipelines.verify import verify_onnx

    ckpt, folder = tiny
    other = make_checkpoint(tmp_path / "other", **{**SPEC, "num_layers": 3})
    loaded = load_wide_model(ckpt, dtype="float32")
    report = verify_onnx(folder, loaded=loaded, load_kwargs=_kw(other), sliced=False, batch=1, steps=0,
                         prompt_len=2)
    assert report.passed is True


def test_sliced_verification_loads_the_reference_lazily(tiny, monkeypatch):
    """--sliced never holds the whole float32 reference: its checkpoint is opened lazily (streamed);
    the whole-graph check loads it whole."""
    import wide_export.checkpoint as checkpoint
    from wide_export.pipelines.verify import verify_onnx

    ckpt, folder = tiny
    real, asked = checkpoint.load_wide_model, []
    monkeypatch.setattr(checkpoint, "load_wide_model", lambda **kw: asked.append(kw["lazy"]) or real(**kw))
    verify_onnx(folder, load_kwargs=_kw(ckpt), sliced=True, batch=1, steps=0, prompt_len=2)
    verify_onnx(folder, load_kwargs=_kw(ckpt), sliced=False, batch=1, steps=0, prompt_len=2)
    assert asked == [True, False]


BF16_NOTE = ("bfloat16: run by onnx.reference.ReferenceEvaluator with ml_dtypes bfloat16 tensors (the graph as "
             "written; ONNX Runtime's CPU provider has no bf16 kernels)")


def test_a_bfloat16_export_is_verified_by_the_reference_evaluator(tiny_bf16):
    """A bf16 export runs whole in onnx's reference evaluator: its target, bf16 tolerance, the note saying
    so, the `evaluator` stage, every output and router compared, and a passing verdict."""
    from wide_export.pipelines.verify import verify_onnx
    from wide_export.verify.tolerances import tolerance_for

    ckpt, folder = tiny_bf16
    stages = _Recorded()
    report = verify_onnx(folder, load_kwargs=_kw(ckpt), stages=stages, sliced=False, batch=1, steps=1,
                         prompt_len=2)
    assert report.target == "onnx-reference-evaluator" and report.dtype == "bfloat16"
    assert report.tolerance == tolerance_for("bfloat16").to_dict()
    assert report.notes == [BF16_NOTE]
    assert stages.names == ["reference", "evaluator"]
    assert [r.name for r in report.outputs] == ["logits", "present.0.key", "present.0.value", "present.1.key",
                                                "present.1.value"]
    # batch 1, 2 prompt tokens + 1 decode step; 4 attention groups, 12 FFN groups
    assert [r.decisions for r in report.decisions] == [1 * 3 * 4, 1 * 3 * 12] * 2
    assert report.passed is True, report.to_dict()
    logits = next(r for r in report.outputs if r.name == "logits")
    assert 0 < logits.mean_abs  # bf16 rounding is there: not a float32 run
