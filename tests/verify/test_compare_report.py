"""verify/compare.py against hand computations: error statistics over steps, decision counting and its
thresholds (agreement, margin), the report's verdict and file, the stepping of the past, the printed tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wide_export.verify import compare as cmp
from wide_export.verify.compare import DecisionRow, OutputRow, VerifyReport, compare, run_steps
from wide_export.verify.reference import Step
from wide_export.verify.tolerances import Tolerance

ATTN = "/model/layers.0/router_attention/mask"
FFN = "/model/layers.0/router_ffn/mask"


def _report(tol: Tolerance) -> VerifyReport:
    return VerifyReport("t", "float32", tol.to_dict(), {})


# -- output errors over several steps
def test_output_rows_take_the_worst_step_and_the_mean_of_the_step_means():
    """Two steps of logits (no zeros, so Polygraphy's relative error is |got - ref| / |got| exactly)."""
    tol = Tolerance(atol=0.15, rtol=0.0, stat="elemwise", min_agreement=0.0, flip_margin=1.0)
    ref0 = np.array([[1.0, 2.0, 4.0, 8.0]], np.float32)
    ref1 = np.array([[2.0, 2.0, 2.0, 2.0]], np.float32)
    got0 = ref0 + np.array([[0.1, 0.0, 0.0, 0.0]], np.float32)  # abs 0.1 on 1.1
    got1 = ref1 + np.array([[0.0, 0.0, 0.2, 0.0]], np.float32)  # abs 0.2 on 2.2 (above atol 0.15)
    steps = [Step(feed={}, ref={"logits": ref0}), Step(feed={}, ref={"logits": ref1})]
    report = compare(steps, [{"logits": got0}, {"logits": got1}], tol, _report(tol), "onnxrt")
    (row,) = report.outputs
    assert row.name == "logits"
    assert row.max_abs == pytest.approx(0.2, abs=1e-6)  # the worse step
    assert row.max_rel == pytest.approx(max(0.1 / 1.1, 0.2 / 2.2), rel=1e-5)
    assert row.mean_abs == pytest.approx((0.1 / 4 + 0.2 / 4) / 2, rel=1e-5)  # mean of the per-step means
    assert row.passed is False  # step 1 fails, though step 0 passes
    assert report.passed is False
    # both steps within atol: passes
    ok = compare(steps, [{"logits": got0}, {"logits": ref1.copy()}], tol, _report(tol), "onnxrt")
    assert ok.outputs[0].passed is True and ok.passed is True
    assert ok.outputs[0].max_abs == pytest.approx(0.1, abs=1e-6)


def test_mean_statistic_passes_a_single_outlier_that_elementwise_refuses():
    """stat=mean: the mean |abs| (0.4 / 8 = 0.05) is under atol though one element (0.4) is not."""
    ref = np.full((1, 8), 3.0, np.float32)
    got = ref.copy()
    got[0, 5] += 0.4
    steps, outs = [Step(feed={}, ref={"logits": ref})], [{"logits": got}]
    mean = Tolerance(atol=0.1, rtol=0.0, stat="mean", min_agreement=0.0, flip_margin=1.0)
    elem = Tolerance(atol=0.1, rtol=0.0, stat="elemwise", min_agreement=0.0, flip_margin=1.0)
    assert compare(steps, outs, mean, _report(mean), "x").outputs[0].passed is True
    assert compare(steps, outs, elem, _report(elem), "x").outputs[0].passed is False


def test_relative_tolerance_alone_can_pass_an_element():
    """|a - b| = 0.5 > atol, but 0.5 / 100.5 < rtol = 1e-2: passes (either bound suffices)."""
    ref = np.array([[100.0, 1.0]], np.float32)
    got = np.array([[100.5, 1.0]], np.float32)
    tol = Tolerance(atol=1e-3, rtol=1e-2, stat="elemwise", min_agreement=0.0, flip_margin=1.0)
    report = compare([Step(feed={}, ref={"logits": ref})], [{"logits": got}], tol, _report(tol), "x")
    assert report.outputs[0].passed is True
    tighter = Tolerance(atol=1e-3, rtol=1e-3, stat="elemwise", min_agreement=0.0, flip_margin=1.0)
    assert compare([Step(feed={}, ref={"logits": ref})], [{"logits": got}], tighter, _report(tighter),
                   "x").outputs[0].passed is False


def test_missing_outputs_are_named_three_at_most():
    names = ["logits", *(f"present.{i}.key" for i in range(4))]
    ref = {n: np.ones((1, 2), np.float32) for n in names}
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.9, 0.1)
    with pytest.raises(RuntimeError) as err:
        compare([Step(feed={}, ref=ref)], [{"logits": ref["logits"]}], tol, _report(tol), "trt")
    said = str(err.value)
    assert said.startswith("trt ") and said.endswith(" ['present.0.key', 'present.1.key', 'present.2.key']"), said


def test_attention_flips_and_what_they_explain_directly():
    """_attention_flipped: per token of an FFN mask, whether the same layer's attention flipped; all False
    for an attention mask itself, and where the runner or the reference lacks the attention mask."""
    ref = {ATTN: np.array([[[1, 1], [1, 1], [0, 1]]], np.int32), FFN: np.ones((1, 3, 4), np.int32)}
    out = {ATTN: np.array([[[1, 1], [0, 1], [0, 1]]], np.int32), FFN: np.ones((1, 3, 4), np.int32)}
    step = Step(feed={}, ref=ref)
    got = cmp._attention_flipped(step, out, FFN)
    assert got.shape == (1, 3, 4) and got[0, :, 0].tolist() == [False, True, False] and got[0, 1].all()
    assert not cmp._attention_flipped(step, out, ATTN).any()  # an attention mask explains nothing
    assert not cmp._attention_flipped(step, {FFN: out[FFN]}, FFN).any()
    assert not cmp._attention_flipped(Step(feed={}, ref={FFN: ref[FFN]}), out, FFN).any()
    assert cmp._flips(step, out, ATTN).tolist() == [[[False, False], [True, False], [False, False]]]


def test_a_clear_attention_flip_is_unexplained():
    """Attention flips are not explained by anything upstream in their layer: a flip beyond the margin fails."""
    ref = {"logits": np.ones((1, 2, 2), np.float32), ATTN: np.ones((1, 2, 2), np.int32)}
    got = {k: v.copy() for k, v in ref.items()}
    got[ATTN][0, 1, 0] = 0
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.0, 0.1)
    report = compare([Step(feed={}, ref=ref, margins={ATTN: np.full((1, 2, 2), 2.0, np.float32)})], [got], tol,
                     _report(tol), "x")
    (row,) = report.decisions
    assert (row.flips, row.unexplained_flips, row.caused_upstream, row.passed) == (1, 1, 0, False)


def test_a_missing_output_is_named():
    ref = {"logits": np.ones((1, 2), np.float32), "present.0.key": np.ones((1, 2), np.float32)}
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.9, 0.1)
    with pytest.raises(RuntimeError, match=r"^onnxrt .*\['present.0.key'\]$"):
        compare([Step(feed={}, ref=ref)], [{"logits": ref["logits"]}], tol, _report(tol), "onnxrt")


# -- router decisions
def _decisions(ref_mask, got_mask, margins, tol, steps=1):
    ref = {"logits": np.ones((1, 1, 2), np.float32), FFN: np.asarray(ref_mask, np.int32)}
    got = {"logits": np.ones((1, 1, 2), np.float32), FFN: np.asarray(got_mask, np.int32)}
    step = Step(feed={}, ref=ref, margins={FFN: np.asarray(margins, np.float32)})
    report = compare([step] * steps, [got] * steps, tol, _report(tol), "onnxrt")
    (row,) = report.decisions
    return report, row


def test_decision_counts_sparsity_and_agreement_by_hand():
    """10 decisions, 4 skipped by the reference (0), 2 flipped (near-ties): agreement 8/10."""
    ref = [[[1, 0, 1, 0, 1, 0, 1, 0, 1, 1]]]
    got = [[[0, 0, 1, 0, 1, 1, 1, 0, 1, 1]]]  # flips at 0 and 5
    margins = [[[0.01, 5, 5, 5, 5, -0.02, 5, 5, 5, 5]]]  # signed: |.| is what counts
    tol = Tolerance(1e-3, 1e-3, "elemwise", min_agreement=0.8, flip_margin=0.05)
    report, row = _decisions(ref, got, margins, tol)
    assert (row.mask, row.decisions, row.flips, row.unexplained_flips, row.caused_upstream) == (FFN, 10, 2, 0, 0)
    assert row.skipped == pytest.approx(0.4)
    assert row.agreement == pytest.approx(0.8)
    assert row.passed is True and report.passed is True  # agreement == min_agreement passes
    stricter = Tolerance(1e-3, 1e-3, "elemwise", min_agreement=0.81, flip_margin=0.05)
    assert _decisions(ref, got, margins, stricter)[1].passed is False


def test_decisions_over_steps_are_counted_together():
    ref, got, margins = [[[1, 1]]], [[[1, 0]]], [[[5.0, 0.01]]]
    tol = Tolerance(1e-3, 1e-3, "elemwise", min_agreement=0.0, flip_margin=0.05)
    _, row = _decisions(ref, got, margins, tol, steps=3)
    assert (row.decisions, row.flips, row.unexplained_flips) == (6, 3, 0)
    assert row.agreement == pytest.approx(0.5) and row.skipped == pytest.approx(0.0)


@pytest.mark.parametrize("margin, unexplained", [(0.05, 0), (0.0500001, 1), (-0.06, 1), (0.049, 0)])
def test_a_flip_is_unexplained_only_beyond_the_margin(margin, unexplained):
    """flip_margin 0.05: a flip whose |reference margin| is at most 0.05 is precision, beyond it a bug."""
    tol = Tolerance(1e-3, 1e-3, "elemwise", min_agreement=0.0, flip_margin=0.05)
    report, row = _decisions([[[1, 1, 1, 1]]], [[[1, 0, 1, 1]]], [[[9, margin, 9, 9]]], tol)
    assert row.flips == 1 and row.unexplained_flips == unexplained
    assert row.passed is (unexplained == 0) and report.passed is (unexplained == 0)


def test_graph_without_masks_is_a_note_not_a_decision_check():
    ref = {"logits": np.ones((1, 2), np.float32), FFN: np.ones((1, 1, 2), np.int32)}
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.9, 0.1)
    report = compare([Step(feed={}, ref=ref, margins={FFN: np.ones((1, 1, 2), np.float32)})],
                     [{"logits": ref["logits"]}], tol, _report(tol), "trt")
    assert report.decisions == []
    assert report.notes == ["trt exposes no router masks: decision agreement not measured"]
    assert report.passed is True


def test_attention_flips_explain_ffn_flips_on_their_token_only_in_the_same_layer():
    """Layer 1's attention flip at token 0 does not explain layer 0's FFN flip at token 0."""
    attn1 = "/model/layers.1/router_attention/mask"
    ones = np.ones((1, 2, 2), np.int32)
    ref = {"logits": np.ones((1, 2, 2), np.float32), FFN: ones, attn1: ones}
    got = {k: v.copy() for k, v in ref.items()}
    got[FFN][0, 0, 1] = 0
    got[attn1][0, 0, 0] = 0
    margins = {FFN: np.full((1, 2, 2), 3.0, np.float32), attn1: np.full((1, 2, 2), 0.01, np.float32)}
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.0, 0.1)
    report = compare([Step(feed={}, ref=ref, margins=margins)], [got], tol, _report(tol), "x")
    rows = {r.mask: r for r in report.decisions}
    assert (rows[FFN].unexplained_flips, rows[FFN].caused_upstream) == (1, 0)
    assert rows[attn1].flips == 1 and rows[attn1].unexplained_flips == 0


def test_an_attention_flip_explains_every_group_of_its_token():
    """Token 1's attention flip explains both clear FFN flips on token 1, none on token 0."""
    ones = np.ones((1, 2, 3), np.int32)
    ref = {"logits": np.ones((1, 2, 2), np.float32), ATTN: ones.copy(), FFN: ones.copy()}
    got = {k: v.copy() for k, v in ref.items()}
    got[ATTN][0, 1, 2] = 0
    got[FFN][0, 1, 0] = got[FFN][0, 1, 1] = got[FFN][0, 0, 2] = 0
    margins = {ATTN: np.full((1, 2, 3), 0.01, np.float32), FFN: np.full((1, 2, 3), 3.0, np.float32)}
    tol = Tolerance(1e-3, 1e-3, "elemwise", 0.0, 0.1)
    report = compare([Step(feed={}, ref=ref, margins=margins)], [got], tol, _report(tol), "x")
    ffn = next(r for r in report.decisions if r.mask == FFN)
    assert (ffn.flips, ffn.unexplained_flips, ffn.caused_upstream) == (3, 1, 2)
    assert ffn.passed is False


# -- the report
def _row(passed=True, name="logits"):
    return OutputRow(name, 0.5, 0.25, 0.125, passed)


def _drow(passed=True):
    return DecisionRow(FFN, 10, 0.4, 0.9, 1, 0, passed, 0)


@pytest.mark.parametrize("outputs, decisions, passed", [
    ([], [], True), ([_row()], [_drow()], True), ([_row(), _row(False)], [_drow()], False),
    ([_row()], [_drow(), _drow(False)], False)])
def test_report_passes_only_when_every_row_passes(outputs, decisions, passed):
    report = VerifyReport("onnxruntime", "float16", {"atol": 1}, {"batch": 2}, outputs, decisions)
    assert report.passed is passed
    assert report.to_dict()["passed"] is passed


def test_report_file_is_json_with_the_verdict_in_a_new_folder(tmp_path):
    report = VerifyReport("onnxruntime", "float16", {"atol": 0.03}, {"batch": 2}, [_row(False)], [_drow()],
                          ["a note"])
    path = tmp_path / "new" / "deeper" / "verify.json"
    report.write(path)
    text = path.read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "target": "onnxruntime",\n  "dtype"')  # indent 2
    data = json.loads(text)
    assert data["passed"] is False and data["target"] == "onnxruntime" and data["dtype"] == "float16"
    assert data["tolerance"] == {"atol": 0.03} and data["settings"] == {"batch": 2} and data["notes"] == ["a note"]
    assert data["outputs"] == [{"name": "logits", "max_abs": 0.5, "max_rel": 0.25, "mean_abs": 0.125,
                                "passed": False}]
    report.write(path)  # the folder exists now: written again
    assert json.loads(path.read_text()) == data
    assert data["decisions"][0] == {"mask": FFN, "decisions": 10, "skipped": 0.4, "agreement": 0.9, "flips": 1,
                                    "unexplained_flips": 0, "passed": True, "caused_upstream": 0}


# -- stepping
class _Runner:
    """A Polygraphy-runner stand-in: records feeds, answers present.i.* = past + 1 and logits."""

    def __init__(self):
        self.feeds, self.active, self.entered, self.exited = [], False, 0, 0

    def __enter__(self):
        self.active, self.entered = True, self.entered + 1
        return self

    def __exit__(self, *exc):
        self.active, self.exited = False, self.exited + 1
        return False

    def infer(self, feed):
        assert self.active
        self.feeds.append(feed)
        out = {"logits": [float(len(self.feeds))]}
        for i in range(2):
            for kv in ("key", "value"):
                past = feed.get(f"past_key_values.{i}.{kv}", np.zeros(1))
                out[f"present.{i}.{kv}"] = past + (10 if kv == "key" else 20) * (i + 1)
        return out


def test_run_steps_feeds_each_step_the_previous_present_as_past():
    empty = np.zeros(1)
    first = {"input_ids": np.array([1]), **{f"past_key_values.{i}.{kv}": empty for i in range(2)
                                            for kv in ("key", "value")}}
    steps = [Step(feed=first, ref={}), Step(feed={"input_ids": np.array([2])}, ref={}),
             Step(feed={"input_ids": np.array([3])}, ref={})]
    runner = _Runner()
    outs = run_steps(runner, steps, num_layers=2)
    assert runner.entered == 1 and runner.exited == 1 and len(outs) == 3
    assert [f["input_ids"][0] for f in runner.feeds] == [1, 2, 3]
    # step 2's past is step 1's present: layer i's key grew by 10 (i+1) each step, value by 20 (i+1)
    assert runner.feeds[2]["past_key_values.1.key"][0] == 2 * 20
    assert runner.feeds[2]["past_key_values.0.value"][0] == 2 * 20
    assert runner.feeds[1]["past_key_values.1.value"][0] == 40
    assert runner.feeds[1]["past_key_values.0.key"][0] == 10
    assert all(isinstance(v, np.ndarray) for o in outs for v in o.values())  # lists became arrays
    assert outs[2]["logits"].tolist() == [3.0]
    assert "past_key_values.0.key" not in steps[1].feed  # the steps themselves are not changed


# -- printing
def test_short_names_of_router_masks():
    assert cmp._short("/model/layers.3/router_ffn/mask") == "L3 ffn"
    assert cmp._short("/model/layers.12/router_attention/mask") == "L12 attn"
    assert cmp._short("/odd/name") == "/odd/name"
    assert cmp._short("/a/b/c") == "Lb c"


def test_grouped_outputs_fold_layers_to_their_worst():
    rows = [OutputRow("logits", 1.0, 2.0, 3.0, True),
            OutputRow("present.0.key", 0.1, 0.2, 0.3, True), OutputRow("present.1.key", 0.4, 0.1, 0.5, False),
            OutputRow("present.0.value", 0.7, 0.8, 0.9, True),
            OutputRow("layer_output.0", 0.01, 0.02, 0.04, True), OutputRow("layer_output.1", 0.03, 0.01, 0.02, True)]
    out = cmp._grouped_outputs(rows)
    assert [(r.name, r.max_abs, r.max_rel, r.passed) for r in out] == [
        ("logits", 1.0, 2.0, True), ("present.*.key (2 layers)", 0.4, 0.2, False),
        ("present.*.value (1 layers)", 0.7, 0.8, True), ("layer_output.* (2 layers)", 0.03, 0.02, True)]
    assert [r.mean_abs for r in out] == pytest.approx([3.0, 0.4, 0.9, 0.03])
    assert cmp._grouped_outputs([rows[0]]) == [rows[0]]


def _printed(report, capsys) -> str:
    """What print_report wrote to stderr, its wrapped lines joined with single spaces."""
    cmp.print_report(report)
    return " ".join(capsys.readouterr().err.split())


def _full_report(passed_decision=True):
    tol = Tolerance(atol=0.03, rtol=0.04, stat="mean", min_agreement=0.955, flip_margin=0.1)
    return VerifyReport("onnxruntime", "float16", tol.to_dict(), {},
                        [OutputRow("logits", 1.234e-3, 5.6e-2, 7.5e-5, True)],
                        [DecisionRow("/model/layers.2/router_ffn/mask", 120, 0.25, 0.99583, 3, 0, passed_decision, 2)],
                        ["first note"])


def test_printed_report_shows_the_numbers_tolerances_and_verdict(capsys):
    text = _printed(_full_report(), capsys)
    assert "onnxruntime vs PyTorch reference (float16)" in text
    assert "1.23e-03" in text and "5.60e-02" in text and "7.50e-05" in text
    assert "router decisions" in text and "L2 ffn" in text and "120" in text
    assert "25 %" in text and "99.58 %" in text
    assert ("note: 2 FFN router flip(s) beyond the margin are on tokens whose attention decision in the same "
            "layer flipped (that changes the FFN router's input): not counted as unexplained") in text
    assert "note: first note" in text
    assert "tolerances: atol 0.03, rtol 0.04 (mean); decisions >= 95.5 % agree, no flip with margin > 0.1" in text
    assert text.endswith("PASSED") and "FAILED" not in text
    assert "yes" in text and "NO" not in text


def test_printed_report_of_a_failure(capsys):
    text = _printed(_full_report(passed_decision=False), capsys)
    assert text.endswith("FAILED") and "PASSED" not in text
    assert "NO" in text


def test_printed_report_without_decisions_or_upstream_flips(capsys):
    report = VerifyReport("trt", "float32", Tolerance(1e-4, 1e-3, "elemwise", 0.99, 1e-3).to_dict(), {},
                          [OutputRow("logits", 0.0, 0.0, 0.0, True)])
    text = _printed(report, capsys)
    assert "router decisions" not in text and "FFN router flip" not in text and "note:" not in text
    assert "decisions >= 99.0 % agree" in text


def _table_rows(text: str) -> list[str]:
    """The header and body lines of the rich tables (box characters ┃ │ kept)."""
    return [line.rstrip() for line in text.splitlines() if line.startswith(("┃", "│"))]


def _line(bar: str, cells: list[str], widths: list[int], left_columns: int = 1) -> str:
    """A table line by hand: the first column left-justified, the others right-justified."""
    padded = [c.ljust(w) if i < left_columns else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
    return bar + bar.join(f" {p} " for p in padded) + bar


def test_printed_tables_line_by_line(capsys, monkeypatch):
    """Both tables at a width that wraps nothing: headers, right-justified numbers, the folded presents,
    the verdict column; the titles flush left."""
    monkeypatch.setenv("COLUMNS", "200")
    report = _full_report()
    report.outputs += [OutputRow("present.0.key", 2.5e-4, 1e-2, 1e-5, False),
                       OutputRow("present.1.key", 3.5e-4, 2e-2, 3e-5, True)]
    report.decisions.append(DecisionRow("/model/layers.12/router_attention/mask", 4000, 0.808, 0.5, 2000, 7, False))
    cmp.print_report(report)
    text = capsys.readouterr().err
    lines = text.splitlines()
    assert lines[0].rstrip() == "onnxruntime vs PyTorch reference (float16)"
    assert "router decisions" in [line.rstrip() for line in lines]
    outputs = [["output", "max |abs|", "max rel", "mean |abs|", "ok"],
               ["logits", "1.23e-03", "5.60e-02", "7.50e-05", "yes"],
               ["present.*.key (2 layers)", "3.50e-04", "2.00e-02", "2.00e-05", "NO"]]
    decisions = [["router", "decisions", "skipped", "agreement", "flips", "unexplained", "ok"],
                 ["L2 ffn", "120", "25 %", "99.58 %", "3", "0", "yes"],
                 ["L12 attn", "4000", "81 %", "50.00 %", "2000", "7", "NO"]]
    want = []
    for table in (outputs, decisions):
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        want.append(_line("┃", table[0], widths))
        want += [_line("│", row, widths) for row in table[1:]]
    assert _table_rows(text) == want
    assert text.endswith("FAILED\n")


def test_printed_report_on_a_colour_terminal_highlights_nothing_but_the_verdict(capsys, monkeypatch):
    """FORCE_COLOR: as on a terminal. Only our own markup is coloured (yes/NO, PASSED/FAILED); numbers in
    the note and tolerance lines are not highlighted by rich."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    cmp.print_report(_full_report())
    lines = capsys.readouterr().err.splitlines()
    plain = [line for line in lines if line.startswith(("note:", "tolerances:"))]
    assert len(plain) == 3 and all("\x1b[" not in line for line in plain), plain
    assert "\x1b[" in lines[-1] and "PASSED" in lines[-1]  # the verdict is coloured
