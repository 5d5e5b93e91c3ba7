"""The manifests `verify` reads are read as every JSON file of a user's folder is (paths.confined + read_json):
wide_engine.json of `verify --engine` and the tensor-parallel manifest's rank folders stay inside their folder,
and damaged or absurdly nested JSON is one WideError line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wide_export.base.errors import WideError


def test_trt_verify_refuses_an_engine_manifest_linked_outside(tmp_path):
    from wide_export.trt.verify import read_manifest

    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"engines": [{"file": "wide.engine"}]}))
    folder = tmp_path / "engines"
    folder.mkdir()
    (folder / "wide_engine.json").symlink_to(outside)
    with pytest.raises(WideError, match="outside"):
        read_manifest(folder)


@pytest.mark.parametrize("text,what", [("{not json", "not valid JSON"), ("[" * 5000 + "]" * 5000, "nested too deep"),
                                       ('{"engines": []}', "lists no engines"), ("[1, 2]", "lists no engines")])
def test_trt_verify_a_damaged_engine_manifest_is_one_error(tmp_path, text, what):
    from wide_export.trt.verify import read_manifest

    (tmp_path / "wide_engine.json").write_text(text)
    with pytest.raises(WideError, match=what) as err:
        read_manifest(tmp_path)
    assert "\n" not in str(err.value)


def test_trt_verify_reads_a_good_manifest_and_hints_at_the_command_for_a_missing_one(tmp_path):
    from wide_export.base.engine_manifest import REBUILD_HINT
    from wide_export.trt.verify import read_manifest

    with pytest.raises(WideError) as err:
        read_manifest(tmp_path)
    assert "wide-export trt" in err.value.hint
    (tmp_path / "wide_engine.json").write_text('{"engines": []}')
    with pytest.raises(WideError) as err:
        read_manifest(tmp_path)
    assert err.value.hint == REBUILD_HINT
    good = {"engines": [{"file": "wide.engine"}], "format": "x"}
    (tmp_path / "wide_engine.json").write_text(json.dumps(good))
    assert read_manifest(tmp_path) == good


def test_tp_manifest_rank_folders_stay_inside_the_export(tmp_path):
    from wide_export.tp.ranks import FORMAT, MANIFEST, read_manifest

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.onnx").write_bytes(b"x")
    folder = tmp_path / "export"
    (folder / "rank0").mkdir(parents=True)
    (folder / "rank0" / "model.onnx").write_bytes(b"x")
    manifest = {"format": FORMAT, "world_size": 2, "ranks": [{"folder": "rank0"}, {"folder": "../outside"}]}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(WideError, match="rank folder .*outside"):
        read_manifest(folder)
    manifest["ranks"][1]["folder"] = "rank0"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert read_manifest(Path(folder))["world_size"] == 2


def test_a_tp_manifest_of_another_shape_is_one_error_with_the_rerun_hint(tmp_path):
    from wide_export.tp.ranks import FORMAT, MANIFEST, read_manifest

    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "model.onnx").write_bytes(b"x")
    good = {"format": FORMAT, "world_size": 1, "ranks": [{"folder": "rank0"}]}
    path = tmp_path / MANIFEST
    for bad in ([], {**good, "format": "wide-tp/0"}, {**good, "world_size": 2}, {**good, "ranks": "rank0"},
                {"world_size": 1, "ranks": [{"folder": "rank0"}]}):
        path.write_text(json.dumps(bad))
        with pytest.raises(WideError) as err:
            read_manifest(tmp_path)
        assert err.value.message.startswith(f"{path} ") and "manifest" in err.value.message
        assert "wide-export onnx --tp" in err.value.hint
    path.write_text("{")
    with pytest.raises(WideError) as err:
        read_manifest(tmp_path)
    assert str(tmp_path / MANIFEST) in err.value.message and "wide-export onnx --tp" in err.value.hint
    path.write_text(json.dumps({**good, "ranks": [{"folder": "rank1"}]}))
    with pytest.raises(WideError) as err:
        read_manifest(tmp_path)
    assert err.value.message.startswith(f"{tmp_path / 'rank1'} ") and "model.onnx" in err.value.message
    assert "wide-export onnx --tp" in err.value.hint
    path.write_text(json.dumps(good))
    assert read_manifest(tmp_path) == good
