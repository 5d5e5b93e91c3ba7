"""Hostile export and engine folders: every file `wide-export triton --onnx F`,
`triton --engines E` and `verify --onnx F` read, link or copy resolves inside F or E -- external-data
locations checked before anything is opened or linked -- the repository shares no inode with a file that
has another name, and model limits no KV cache could hold are refused. Each case ends in one line
`error: ... (hint: ...)`, exit 2; a secret outside never reaches the repository and keeps its link count."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest

from tests.faults.hostile import SECRET, cli, copy, no_secret_in, refused, secret  # noqa: F401 - fixture
from tests.helpers import assert_one_line_error
from tests.triton.engine_manifest import write_engine_folder


def _external(folder: Path, location: str) -> None:
    """Point model.onnx's first initializer at external data `location` (offset 0, its own length)."""
    model = onnx.load(str(folder / "model.onnx"))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(len(SECRET) // 4 * 4))):
        tensor.external_data.add(key=key, value=value)
    onnx.save(model, str(folder / "model.onnx"))


def _export_folder(tiny, tmp_path) -> Path:
    """The tiny contract model with the wide_config.json fields `verify` reads too."""
    folder = copy(tiny[0], tmp_path / "export")
    cfg = json.loads((folder / "wide_config.json").read_text())
    cfg["files"] = {"model": "model.onnx", "external_data": None}
    (folder / "wide_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("location", ["relative", "absolute", "symlink"])
def test_triton_refuses_external_data_outside_the_export(tiny, secret, tmp_path, location):
    """Why 1: `location: ../../etc/shadow` (or absolute) was hard-linked into the repository, exit 0."""
    folder = _export_folder(tiny, tmp_path)
    if location == "symlink":
        (folder / "weights.data").symlink_to(secret)
    _external(folder, {"relative": os.path.relpath(secret, folder), "absolute": str(secret),
                       "symlink": "weights.data"}[location])
    links = secret.stat().st_nlink
    out = tmp_path / "repo"
    refused(cli("triton", "--onnx", folder, "-o", out), out, "external data", "outside")
    assert secret.stat().st_nlink == links
    no_secret_in(out)


@pytest.mark.parametrize("name", ["model.onnx", "wide_config.json"])
def test_triton_refuses_export_files_linked_outside(tiny, tmp_path, name):
    folder = _export_folder(tiny, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(folder / name, elsewhere / name)
    (folder / name).symlink_to(elsewhere / name)
    out = tmp_path / "repo"
    refused(cli("triton", "--onnx", folder, "-o", out), out, str(folder / name), "outside")


def test_triton_never_shares_an_inode_with_a_file_linked_elsewhere(tiny, tmp_path):
    """A hard link has no "outside" to resolve to: a graph that also has another name (here one outside
    the export) is copied into the repository, so writing through the repository changes nothing else;
    a file that is only the export's own is still linked (no copy of big weights)."""
    folder = _export_folder(tiny, tmp_path)
    outside = tmp_path / "outside.onnx"
    shutil.move(folder / "model.onnx", outside)
    os.link(outside, folder / "model.onnx")
    out = tmp_path / "repo"
    result = cli("triton", "--onnx", folder, "-o", out)
    assert result.exit_code == 0, result.output
    served = out / "wide_llm" / "1"
    assert outside.stat().st_nlink == 2  # the export's name and its own: the repository added none
    assert not (served / "model.onnx").samefile(outside)
    assert (served / "model.onnx").read_bytes() == outside.read_bytes()
    assert (served / "wide_config.json").samefile(folder / "wide_config.json")  # its own: linked


@pytest.mark.parametrize("field,value", [("max_position_embeddings", 10**12), ("vocab_size", 10**12),
                                         ("vocab_size", 62)])
def test_triton_refuses_impossible_model_limits(tiny, tmp_path, field, value):
    """Why 9: 10^12 positions or vocabulary entries switched the server's length limit off; a vocabulary
    the graph's logits disagree with (61 wide) is a folder of mixed exports."""
    folder = _export_folder(tiny, tmp_path)
    cfg = json.loads((folder / "wide_config.json").read_text())
    (folder / "wide_config.json").write_text(json.dumps({**cfg, field: value}))
    out = tmp_path / "repo"
    refused(cli("triton", "--onnx", folder, "-o", out), out, str(value))


def _verify(folder: Path):
    return cli("verify", "--onnx", folder)


@pytest.mark.parametrize("case", ["truncated", "external_outside", "files_model_outside", "files_model_absolute"])
def test_verify_on_a_hostile_export_is_one_line(tiny, secret, tmp_path, case):
    """Why 10: verify on a truncated model.onnx, on external data outside the folder, or with
    files.model pointing outside ended in a traceback."""
    folder = _export_folder(tiny, tmp_path)
    cfg = json.loads((folder / "wide_config.json").read_text())
    if case == "truncated":
        data = (folder / "model.onnx").read_bytes()
        (folder / "model.onnx").write_bytes(data[: len(data) // 2])
        expect = "model.onnx is not a readable ONNX model"
    elif case == "external_outside":
        _external(folder, os.path.relpath(secret, folder))
        expect = "outside"
    else:
        other = copy(folder, tmp_path / "other")
        name = os.path.relpath(other / "model.onnx", folder) if case == "files_model_outside" else str(secret)
        cfg["files"]["model"] = name
        (folder / "wide_config.json").write_text(json.dumps(cfg))
        expect = "files.model"
    before = sorted(p.name for p in folder.iterdir())
    _ = assert_one_line_error(_verify(folder))
    assert expect in _
    assert sorted(p.name for p in folder.iterdir()) == before  # no report written


# ---------------------------------------------------------------- engine folder (`triton --engines`)
@pytest.mark.parametrize("what", ["engine", "plugin", "plugin_symlink"])
def test_triton_refuses_engine_files_outside_the_engine_folder(secret, tmp_path, what):
    engines = tmp_path / "engines"
    manifest = write_engine_folder(engines)
    if what == "engine":
        manifest["engines"][0]["file"] = os.path.relpath(secret, engines)
    elif what == "plugin":
        manifest["plugins"] = [str(secret)]
    else:
        (engines / "libwide_plugins.so").unlink()
        (engines / "libwide_plugins.so").symlink_to(secret)
    (engines / "wide_engine.json").write_text(json.dumps(manifest))
    links = secret.stat().st_nlink
    out = tmp_path / "repo"
    refused(cli("triton", "--engines", engines, "-o", out), out, "outside")
    assert secret.stat().st_nlink == links
    no_secret_in(out)


def test_triton_refuses_an_engine_manifest_of_impossible_limits(tmp_path):
    engines = tmp_path / "engines"
    manifest = write_engine_folder(engines)
    manifest["model"]["max_position_embeddings"] = 10**12
    (engines / "wide_engine.json").write_text(json.dumps(manifest))
    out = tmp_path / "repo"
    refused(cli("triton", "--engines", engines, "-o", out), out, "max_position_embeddings")


# ---------------------------------------------------------------- `wide-export trt --onnx`
def test_trt_refuses_external_data_outside_the_export(tiny, secret, tmp_path):
    """TensorRT's ONNX parser reads external data by location too: checked before it (or a child) runs."""
    folder = _export_folder(tiny, tmp_path)
    _external(folder, os.path.relpath(secret, folder))
    out = tmp_path / "engines"
    refused(cli("trt", "--onnx", folder, "-o", out, "--max-seq-len", 64, "--max-input-len", 32), out,
            "external data", "outside")
