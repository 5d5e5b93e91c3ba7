"""Damaged checkpoints: an empty or truncated model.safetensors, a config.json that is a JSON list
or holds a size as a string. Each ends in one line `error: ... (hint: ...)`, exit 2, naming the
damaged file, before anything is loaded or written."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint
from wide_export.cli import get_app


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), arch="llama", num_layers=2)


def _copy(ckpt: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(ckpt, folder)
    return folder


def _fails(folder: Path, tmp_path: Path, *expect: str) -> str:
    out = tmp_path / "out"
    result = CliRunner().invoke(get_app(), ["onnx", "--model", str(folder), "-o", str(out)])
    line = assert_one_line_error(result)
    for piece in expect:
        assert piece in line, line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    return line


def _header_end(path: Path) -> int:
    """Where the tensor bytes start, read from the file's own 8-byte length prefix."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


@pytest.mark.parametrize("cut", ["empty", "4 bytes", "inside the header", "inside the data", "one byte short"])
def test_a_damaged_safetensors_file_is_named(ckpt, tmp_path, cut):
    folder = _copy(ckpt, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    end = {"empty": 0, "4 bytes": 4, "inside the header": _header_end(weights) - 10,
           "inside the data": (_header_end(weights) + len(data)) // 2, "one byte short": len(data) - 1}[cut]
    weights.write_bytes(data[:end])
    _fails(folder, tmp_path, str(weights), "hint:")


def test_a_garbled_safetensors_header_is_named(ckpt, tmp_path):
    folder = _copy(ckpt, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:12] = b"\xff\xfe[["
    weights.write_bytes(bytes(data))
    _fails(folder, tmp_path, str(weights), "damaged")


@pytest.mark.parametrize("edit,expect", [
    (lambda cfg: [cfg], "holds a JSON list, not an object"),
    (lambda cfg: "llama", "holds a JSON str, not an object"),
    (lambda cfg: {**cfg, "hidden_size": "512"}, "hidden_size must be a positive integer, got '512' (str)"),
    (lambda cfg: {**cfg, "num_hidden_layers": 2.0}, "num_hidden_layers must be a positive integer"),
    (lambda cfg: {**cfg, "vocab_size": 0}, "vocab_size must be a positive integer, got 0"),
    (lambda cfg: {**cfg, "num_attention_heads": True}, "num_attention_heads must be a positive integer"),
    (lambda cfg: {k: v for k, v in cfg.items() if k != "intermediate_size"}, "intermediate_size must be"),
    (lambda cfg: {**cfg, "rms_norm_eps": "1e-6"}, "rms_norm_eps must be a number"),
], ids=["list", "string", "hidden_size_str", "layers_float", "vocab_zero", "heads_bool", "missing", "eps_str"])
def test_a_hostile_config_json_is_one_line(ckpt, tmp_path, edit, expect):
    folder = _copy(ckpt, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(cfg)))
    _fails(folder, tmp_path, str(folder / "config.json"), expect)
