"""Exports whose weights live in model.onnx.data (every real model: above 256 MiB) verify in ONNX
Runtime, and convert to fp16 keeping their weights external. The threshold is lowered so the
demo model takes that path."""

from __future__ import annotations

import json

import onnx
import pytest


@pytest.fixture(scope="module")
def external_export(tmp_path_factory):
    import wide_export.export.onnx_export as onnx_export
    from wide_export.checkpoint import load_wide_model

    out = tmp_path_factory.mktemp("external") / "onnx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
        onnx_export.export_onnx(load_wide_model(None), out)
    return out


def _has_external_weights(folder) -> bool:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def test_export_with_external_weights_verifies(external_export):
    from wide_export.pipelines.verify import verify_onnx

    assert (external_export / "model.onnx.data").is_file() and _has_external_weights(external_export)
    report = verify_onnx(external_export, steps=1)
    assert report.passed, report.to_dict()


def test_fp16_conversion_keeps_external_weights(external_export, tmp_path, monkeypatch):
    import wide_export.export.onnx_export as onnx_export
    from wide_export.export.fp16 import convert_export
    from wide_export.pipelines.verify import verify_onnx

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    convert_export(external_export, tmp_path)
    assert json.loads((tmp_path / "wide_config.json").read_text())["files"]["external_data"] == "model.onnx.data"
    assert _has_external_weights(tmp_path)
    report = verify_onnx(tmp_path, steps=1)
    assert report.dtype == "float16" and report.passed, report.to_dict()
