"""Hostile model folders: every file `wide-export onnx --model DIR` reads or
copies resolves inside DIR (or, for a Hugging Face cache snapshot, inside the cache's blobs/), and the
folder's inputs are bounded before anything is allocated: JSON size and depth, safetensors headers, the
layer count against the weights present, router.pth's inflated size. Each case is one small reproduction
ending in one line `error: ... (hint: ...)`, exit 2, naming the file; a secret outside never reaches the
export."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.faults.hostile import cli, copy, no_secret_in, refused, secret  # noqa: F401 - fixture
from tests.helpers import make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"), arch="llama", num_layers=2)


def test_a_tokenizer_file_linked_outside_is_not_copied(ckpt, secret, tmp_path):
    """Why 2: `ln -s /etc/shadow DIR/special_tokens_map.json` put the secret into the export."""
    model = copy(ckpt, tmp_path / "model")
    (model / "special_tokens_map.json").symlink_to(secret)
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out,
             "tokenizer file", str(model / "special_tokens_map.json"), str(secret))
    no_secret_in(tmp_path / "out")


@pytest.mark.parametrize("how", ["index", "symlink", "router"])
def test_weights_and_router_outside_the_model_folder_arerefused(ckpt, tmp_path, how):
    model = copy(ckpt, tmp_path / "model")
    other = copy(ckpt, tmp_path / "other")  # readable weights elsewhere: only the folder's own count
    if how == "index":
        (model / "model.safetensors").unlink()
        (model / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.embed_tokens.weight": "../other/model.safetensors"}}))
        named = "../other/model.safetensors"
    elif how == "symlink":
        (model / "model.safetensors").unlink()
        (model / "model.safetensors").symlink_to(other / "model.safetensors")
        named = str(model / "model.safetensors")
    else:
        (model / "router.pth").unlink()
        (model / "router.pth").symlink_to(other / "router.pth")
        named = str(model / "router.pth")
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out, named, "outside")


def test_a_hugging_face_snapshot_linking_into_its_blobs_exports(ckpt, tmp_path):
    """Cache snapshots are symlinks into ../../blobs/ by design: confined there, not banned; and the
    tokenizer files are found beside the snapshot's config.json, not in blobs/."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    tokenizer = b'{"model_max_length": 64}\n'
    (tmp_path / "tokenizer_config.json").write_bytes(tokenizer)
    for i, path in enumerate([*sorted(ckpt.iterdir()), tmp_path / "tokenizer_config.json"]):
        shutil.copy(path, blobs / f"blob{i}")
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{i}")
    out = tmp_path / "out"
    result = cli("onnx", "--model", snapshot, "-o", out, "--no-verify")
    assert result.exit_code == 0, result.output
    assert (out / "tokenizer_config.json").read_bytes() == tokenizer


def _write_header(weights: Path, header: bytes) -> None:
    """model.safetensors with `header` in place of its own (the tensor bytes kept after it)."""
    data = weights.read_bytes()
    end = 8 + struct.unpack("<Q", data[:8])[0]
    weights.write_bytes(struct.pack("<Q", len(header)) + header + data[end:])


@pytest.mark.parametrize("case", ["deep", "metadata_int", "too_large"])
def test_a_hostile_safetensors_header_is_one_line(ckpt, tmp_path, case):
    """Why 10: a header nested deep, or larger than safetensors allows, ended in a traceback."""
    model = copy(ckpt, tmp_path / "model")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    own = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    header = {
        "deep": b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "metadata_int": json.dumps({**own, "__metadata__": {"step": 1}}).encode(),
        "too_large": json.dumps({**own, "__metadata__": {"pad": "x" * 101_000_000}}).encode(),
    }[case]
    _write_header(weights, header)
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out, str(weights))


def test_a_deep_config_json_is_one_line(ckpt, tmp_path):
    model = copy(ckpt, tmp_path / "model")
    (model / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out, str(model / "config.json"), "deep")


def test_a_config_json_nested_beyond_the_depth_limit_is_one_line(ckpt, tmp_path):
    """100 levels parse in Python, but nothing we read nests beyond a few: refused before transformers
    (or json.dumps of the recorded config) recurses through it."""
    model = copy(ckpt, tmp_path / "model")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "extra": json.loads("[" * 100 + "]" * 100)}))
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out, str(model / "config.json"),
            "nested deeper than 64")


def test_a_million_layers_fail_on_the_missing_weights_at_once(ckpt, tmp_path):
    """Why 7: num_hidden_layers 1000000 built decoder modules until memory ran out (a subprocess, so
    that the old behaviour fails by its timeout instead of hanging the suite)."""
    model = copy(ckpt, tmp_path / "model")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1_000_000}))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "wide_export", "onnx", "--model", str(model), "-o", str(out),
                             "--no-verify"], capture_output=True, text=True, timeout=90,
                            env={**os.environ, "COLUMNS": "400"})
    refused(result, out, "num_hidden_layers is 1000000", "model.layers.2.")


def _zip_bomb(router: Path, dst: Path, zero_bytes: int) -> None:
    """`router`'s tensors plus a zero tensor of `zero_bytes`, re-zipped with deflate (a few hundred KB)."""
    import torch

    state = torch.load(router, weights_only=True)
    state["model.layers.0.padding"] = torch.zeros(zero_bytes // 4)
    plain = dst.with_suffix(".plain")
    torch.save(state, plain)
    del state
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for info in zin.infolist():
            with zin.open(info) as r, zout.open(info.filename, "w", force_zip64=True) as w:
                shutil.copyfileobj(r, w, 16 << 20)
    plain.unlink()


def test_a_zip_bomb_router_is_refused_before_torch_load(ckpt, tmp_path, monkeypatch):
    """Why 6: a router.pth inflating far beyond its size is refused from the zip's directory alone."""
    import torch

    model = copy(ckpt, tmp_path / "model")
    _zip_bomb(ckpt / "router.pth", model / "router.pth", 160 << 20)
    assert (model / "router.pth").stat().st_size < 2 << 20
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    out = tmp_path / "out"
    refused(cli("onnx", "--model", model, "-o", out, "--no-verify"), out,
             str(model / "router.pth"), "inflates to")
    assert loads == []  # nothing was inflated


def test_a_stored_router_archive_still_loads(ckpt):
    """torch.save's own archive (entries stored) passes the inflation check whatever its size."""
    from wide_export.checkpoint.torchfile import check_inflated_size

    with zipfile.ZipFile(ckpt / "router.pth") as archive:
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
    check_inflated_size(ckpt / "router.pth", "router")


