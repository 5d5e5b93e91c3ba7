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
from tests.helpers import assert_one_line_error, make_checkpoint


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




# ---- values the runtime computes with: finite and in range, checked where config.json is read (why 8) ------

def _set(model: Path, **values) -> None:
    cfg = json.loads((model / "config.json").read_text())
    for key, value in values.items():  # "a.b": a key of the object `a`
        outer, _, inner = key.partition(".")
        if inner:
            cfg[outer] = {**(cfg.get(outer) or {}), inner: value}
        else:
            cfg[outer] = value
    (model / "config.json").write_text(json.dumps(cfg))  # NaN / Infinity as Python's json writes (and reads) them


@pytest.mark.parametrize("key,value", [
    ("max_position_embeddings", 10**12), ("rms_norm_eps", float("nan")), ("rms_norm_eps", 0.0),
    ("rms_norm_eps", -1e-6), ("rope_theta", 0), ("rope_theta", float("inf")),
    ("rope_parameters.rope_theta", 0.0), ("rope_parameters.rope_theta", float("nan")), ("hidden_size", 2**40),
])
def test_a_config_value_out_of_range_is_one_line_naming_file_and_key(ckpt, tmp_path, key, value):
    """Why 8: max_position_embeddings 1e12 ended `wide-export gguf` in a struct.error traceback; a NaN
    rms_norm_eps or rope_theta 0 were written (or run) silently."""
    pytest.importorskip("gguf")
    model = copy(ckpt, tmp_path / "model")
    _set(model, **{key: value})
    out = tmp_path / "m.gguf"
    refused(cli("gguf", "--model", model, "--out", out), out, str(model / "config.json"), key.split(".")[-1])


def test_generate_reads_the_same_rules(ckpt, tmp_path):
    model = copy(ckpt, tmp_path / "model")
    _set(model, rms_norm_eps=float("nan"))
    line = assert_one_line_error(cli("generate", "--model", model, "--ids", "1,2,3", "--max-new", "2"))
    assert str(model / "config.json") in line and "rms_norm_eps" in line, line


def _poison(model: Path, name: str, value: float) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(model / "model.safetensors"))
    state[name] = state[name].clone()
    state[name].view(-1)[3] = value
    save_file(state, str(model / "model.safetensors"), metadata={"format": "pt"})
    assert not bool(torch.isfinite(state[name]).all())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_on_the_cpu_path(ckpt, tmp_path, value):
    """Why 8: NaN weights loaded silently into `generate` / `serve --model` (both load through
    CpuGenerator.load) and into the GGUF file."""
    from wide_export.generation.cpu_generator import CpuGenerator
    from wide_export.base.errors import WideError

    model = copy(ckpt, tmp_path / "model")
    name = "model.layers.1.mlp.up_proj.weight"
    _poison(model, name, value)
    with pytest.raises(WideError) as err:
        CpuGenerator.load(model)
    assert name in str(err.value) and "\n" not in str(err.value)
    line = assert_one_line_error(cli("generate", "--model", model, "--ids", "1,2,3", "--max-new", "2"))
    assert name in line and str(model) in line, line
    if value != value:  # once is enough for the GGUF writer
        pytest.importorskip("gguf")
        out = tmp_path / "m.gguf"
        refused(cli("gguf", "--model", model, "--out", out), out, name)


# ---- a tokenizer.json that is there but damaged is named, not taken for "no tokenizer" (why 8) ------------

DAMAGED_TOKENIZERS = {
    "not-json": b'{"version": "1.0", "model": ',
    "refused": json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}}).encode(),
    "a-list": b"[1, 2, 3]",
}


@pytest.mark.parametrize("case", list(DAMAGED_TOKENIZERS))
def test_a_damaged_tokenizer_is_an_error_naming_it_in_every_command(ckpt, tmp_path, case):
    from wide_export.generation.cpu_generator import CpuGenerator
    from wide_export.base.errors import WideError

    model = copy(ckpt, tmp_path / "model")
    tokenizer = model / "tokenizer.json"
    tokenizer.write_bytes(DAMAGED_TOKENIZERS[case])
    with pytest.raises(WideError) as err:  # serve --model loads through this too
        CpuGenerator.load(model)
    assert str(tokenizer) in str(err.value) and "no tokenizer" not in str(err.value)
    for args in (["generate", "--model", model, "--prompt", "hi", "--max-new", "2"],
                 ["generate", "--model", model, "--ids", "1,2", "--max-new", "2"]):
        line = assert_one_line_error(cli(*args))
        assert str(tokenizer) in line and "no tokenizer" not in line, line
    pytest.importorskip("gguf")
    out = tmp_path / "m.gguf"
    refused(cli("gguf", "--model", model, "--out", out), out, str(tokenizer))
