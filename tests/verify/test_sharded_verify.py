"""tp/verify.py on a tiny two-rank export made once per session (cached under $WIDE_TEST_EXPORT_CACHE when
scripts/mutation-test.py runs): the float32 export passes the exactness rows, a float16 one the single-device
tolerances, and a broken copy fails in the row that names what broke. tests/tp/test_tp_export.py covers the
architectures and world sizes; this file is the fast pin on the verifier itself (group order included)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.verify.conftest import cached

SETTINGS = dict(steps=2)


def _export_tp(ckpt: Path, dtype: str):
    def export(root: Path) -> None:
        from wide_export.checkpoint import load_wide_model
        from wide_export.tp.export import export_tp
        from wide_export.tp.plan import identity_plan

        loaded = load_wide_model(ckpt, dtype=dtype, lazy=True, checksums=False)
        export_tp(loaded, root / "tp", identity_plan(loaded.config, 2))
    return export


@pytest.fixture(scope="session")
def tiny_tp(tiny_ckpt, tmp_path_factory) -> Path:
    return cached("verify-tiny-tp2-f32", _export_tp(tiny_ckpt, "float32"), tmp_path_factory) / "tp"


def _verify(folder: Path, ckpt: Path, **kwargs):
    from wide_export.pipelines.verify import verify_onnx  # the entry point: it sends a tp export to verify_tp

    return verify_onnx(folder, load_kwargs={"model_dir": ckpt}, **SETTINGS, **kwargs)


def _copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tp"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(".complete"))
    return out


def test_a_float32_sharded_export_passes_the_exactness_rows(tiny_ckpt, tiny_tp, tmp_path):
    report = _verify(tiny_tp, tiny_ckpt, report_path=tmp_path / "report.json")
    assert report.passed, report.to_dict()
    assert report.target == "onnxruntime x 2 ranks (all-reduce simulated)" and report.dtype == "float32"
    # float32's tolerances (verify/tolerances.py), with the TP export's exactness criterion on top
    assert report.tolerance == {"atol": 1e-4, "rtol": 1e-3, "stat": "elemwise", "min_agreement": 1.0,
                                "flip_margin": 0.0, "max_rel_to_max_ref": 1e-5}
    assert report.settings == {"batch": 2, "prompt_len": 7, "steps": 2, "seed": 0, "tp": 2}
    exact = {r.name: r for r in report.outputs if r.name.startswith("tp exact")}
    assert sorted(exact) == ["tp exact: logits max|err|/max|ref|", "tp exact: present.* (2 layers) max|err|/max|ref|"]
    assert all(r.passed and r.max_abs == r.max_rel == r.mean_abs <= 1e-5 for r in exact.values())
    assert not any(r.name.startswith("tp: ranks agree") for r in report.outputs)
    assert len(report.decisions) == 4 and all(d.agreement == 1.0 and d.flips == 0 for d in report.decisions)
    assert report.notes[-1] == ("2 ranks; the replicated logits of the ranks differ by at most 0.0e+00; "
                                "0 router decisions differ between ranks")
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["passed"] is True and written["settings"]["tp"] == 2


def test_a_float16_sharded_export_is_held_to_the_single_device_tolerances(tiny_ckpt, tmp_path_factory):
    folder = cached("verify-tiny-tp2-f16", _export_tp(tiny_ckpt, "float16"), tmp_path_factory) / "tp"
    report = _verify(folder, tiny_ckpt)
    assert report.passed, report.to_dict()
    assert report.dtype == "float16"
    assert report.tolerance == {"atol": 3e-2, "rtol": 3e-2, "stat": "mean", "min_agreement": 0.95,
                                "flip_margin": 0.1, "max_rel_to_max_ref": None}
    assert not any(r.name.startswith("tp exact") for r in report.outputs)


def test_a_bfloat16_sharded_export_is_refused_with_a_hint(tiny_ckpt, tiny_tp, tmp_path):
    from wide_export.base.errors import WideError

    out = _copy(tiny_tp, tmp_path)
    config = out / "rank0" / "wide_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dtype": "bfloat16"}))
    with pytest.raises(WideError) as err:
        _verify(out, tiny_ckpt)
    assert "bfloat16" in err.value.message and "CPU" in err.value.message
    assert "--dtype float32" in err.value.hint


def _load(path: Path):
    import onnx

    return onnx.load(str(path))


def _set_initializer(path: Path, name: str, change) -> None:
    import onnx
    from onnx import numpy_helper

    proto = _load(path)
    tensor = next(t for t in proto.graph.initializer if t.name == name)
    tensor.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(tensor)), name))
    onnx.save(proto, str(path))


def test_rank_1_holding_rank_0s_o_proj_columns_fails_the_exact_logits(tiny_ckpt, tiny_tp, tmp_path):
    """The check is not vacuous: a shard placed on the wrong rank must fail."""
    from onnx import numpy_helper

    out = _copy(tiny_tp, tmp_path)
    name = "model.layers.1.self_attn.o_proj.weight"
    rank0 = next(t for t in _load(out / "rank0" / "model.onnx").graph.initializer if t.name == name)
    _set_initializer(out / "rank1" / "model.onnx", name, lambda w: numpy_helper.to_array(rank0))
    report = _verify(out, tiny_ckpt)
    assert not report.passed
    rows = {r.name: r for r in report.outputs}
    assert not rows["tp exact: logits max|err|/max|ref|"].passed
    assert rows["tp exact: logits max|err|/max|ref|"].max_rel > 1e-3
    assert rows["tp exact: present.* (2 layers) max|err|/max|ref|"].passed  # layer 1's o_proj is after its KV


def test_ranks_whose_replicated_logits_differ_fail_the_agreement_row(tiny_ckpt, tiny_tp, tmp_path):
    out = _copy(tiny_tp, tmp_path)
    _set_initializer(out / "rank1" / "model.onnx", "model.norm.weight", lambda w: w * np.float32(1.5))
    report = _verify(out, tiny_ckpt)
    agree = [r for r in report.outputs if r.name == "tp: ranks agree (logits, masks)"]
    assert len(agree) == 1 and agree[0].passed is False
    assert agree[0].max_abs > 0 and agree[0].max_rel == 0.0 and agree[0].mean_abs == 0.0  # logits differ, masks not
    assert not report.passed
    assert next(r for r in report.outputs if r.name.startswith("tp exact: logits")).passed  # rank 0's are compared
    assert "0 router decisions differ between ranks" in report.notes[-1]
    assert "differ by at most 0.0e+00" not in report.notes[-1]


def test_a_group_order_that_does_not_match_the_graph_fails_that_layers_decisions(tiny_ckpt, tiny_tp, tmp_path):
    """Rank 0's FFN masks are put back in checkpoint group order by wide_config's group_order: a rotated
    record must fail exactly layer 0's FFN decisions."""
    out = _copy(tiny_tp, tmp_path)
    for r in range(2):
        path = out / f"rank{r}" / "wide_config.json"
        config = json.loads(path.read_text())
        order = config["layers"][0]["ffn"]["group_order"]
        config["layers"][0]["ffn"]["group_order"] = order[1:] + order[:1]
        path.write_text(json.dumps(config))
    report = _verify(out, tiny_ckpt)
    assert [d.mask for d in report.decisions if not d.passed] == ["/model/layers.0/router_ffn/mask"]


def test_ranks_whose_router_decisions_differ_fail_the_agreement_row(tiny_ckpt, tiny_tp, tmp_path):
    """Every rank holds the whole router: rank 1 with another layer 0 FFN router decides differently (its logits
    may still match, as the all-reduce sums both ranks' partials)."""
    out = _copy(tiny_tp, tmp_path)
    _set_initializer(out / "rank1" / "model.onnx", "model.layers.0.router_ffn.router.weight", lambda w: -w)
    report = _verify(out, tiny_ckpt)
    agree = [r for r in report.outputs if r.name == "tp: ranks agree (logits, masks)"]
    assert len(agree) == 1 and agree[0].passed is False
    mismatched = int(agree[0].mean_abs)
    assert mismatched > 0 and f"; {mismatched} router decisions differ between ranks" in report.notes[-1]


def test_ranks_whose_graphs_have_other_collectives_are_refused(tiny_ckpt, tiny_tp, tmp_path):
    import onnx

    from wide_export.base.errors import WideError

    out = _copy(tiny_tp, tmp_path)
    path = out / "rank1" / "model.onnx"
    proto = onnx.load(str(path))
    next(n for n in proto.graph.node if n.op_type == "DistCollective").name += "_renamed"
    onnx.save(proto, str(path))
    with pytest.raises(WideError) as err:
        _verify(out, tiny_ckpt)
    assert "collectives" in err.value.message
    assert "wide-export onnx --tp N" in err.value.hint
