"""The streaming export (placeholder weights traced, initializers read from the safetensors shards while
saving) writes exactly what the eager export writes: model.onnx and model.onnx.data byte for byte,
and refuses the same broken checkpoints with the same message."""

from __future__ import annotations

import json
import weakref

import pytest
import torch

from tests.helpers import make_checkpoint
from wide_export.checkpoint import load_wide_model
from wide_export.errors import WideError
from wide_export.export.onnx_export import export_onnx


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("ckpt"), arch="qwen2", lora=True, tie_word_embeddings=True,
                             attn_groups=4, ffn_groups=12)
    return folder


def _export(folder, out, *, lazy, dtype):
    loaded = load_wide_model(folder, lora=folder / "lora.pth", dtype=dtype, lazy=lazy)
    export_onnx(loaded, out)
    return loaded


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_streamed_export_is_byte_identical(checkpoint, tmp_path, monkeypatch, dtype, external):
    import wide_export.export.onnx_export as onnx_export

    if external:
        monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    _export(checkpoint, tmp_path / "eager", lazy=False, dtype=dtype)
    loaded = _export(checkpoint, tmp_path / "stream", lazy=True, dtype=dtype)
    assert loaded.weights is not None and loaded.lora_pairs == 8
    names = ["model.onnx", *(["model.onnx.data"] if external else [])]
    for name in names:
        eager, stream = (tmp_path / d / name for d in ("eager", "stream"))
        assert stream.read_bytes() == eager.read_bytes(), name
    assert (tmp_path / "stream" / "model.onnx.data").exists() == external
    cfg = [json.loads((tmp_path / d / "wide_config.json").read_text()) for d in ("eager", "stream")]
    assert cfg[0] == cfg[1]


def test_lazy_model_holds_no_weights(checkpoint):
    loaded = load_wide_model(checkpoint, lora=checkpoint / "lora.pth", dtype="float16", lazy=True)
    storage = sum(p.untyped_storage().nbytes() for p in loaded.model.parameters())
    assert storage <= 4 * sum(1 for _ in loaded.model.parameters())  # one element each
    eager = load_wide_model(checkpoint, lora=checkpoint / "lora.pth", dtype="float16")
    for name, p in eager.model.named_parameters(remove_duplicate=False):
        got = loaded.weights.tensor(name)
        assert got.dtype == p.dtype and torch.equal(got, p), name


def test_weights_are_read_one_at_a_time(checkpoint, tmp_path, monkeypatch):
    """While saving, no streamed tensor outlives its write: at most one is alive at a time."""
    import wide_export.export.onnx_export as onnx_export
    from wide_export.checkpoint.lazy import WeightSource

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    live: list = []
    most = [0]
    real = WeightSource.tensor

    def tracked(self, name):
        t = real(self, name)
        live.append(weakref.ref(t))
        most[0] = max(most[0], sum(r() is not None for r in live))
        return t

    monkeypatch.setattr(WeightSource, "tensor", tracked)
    loaded = load_wide_model(checkpoint, dtype="float16", lazy=True)
    export_onnx(loaded, tmp_path / "out")
    assert most[0] == 1
    assert len(live) >= len(loaded.weights.names())


def _break(folder, what):
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(str(path))
    if what == "shape":
        state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:-1].clone()
    elif what == "missing":
        del state["model.layers.1.self_attn.k_proj.weight"]
    else:
        state["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(state, str(path))


@pytest.mark.parametrize("what", ["shape", "missing", "unknown"])
def test_same_refusals_as_the_eager_loader(tmp_path, what):
    folder = make_checkpoint(tmp_path / "ckpt", arch="llama")
    _break(folder, what)
    messages = []
    for lazy in (False, True):
        with pytest.raises(WideError) as err:
            load_wide_model(folder, lazy=lazy)
        messages.append(str(err.value))
    assert messages[0] == messages[1]
