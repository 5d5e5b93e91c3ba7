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
from wide_export.base.errors import WideError
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


# Shape plumbing a full trace repeats per layer (each layer's past length read off its own input) and the
# replicated graph shares with layer 1 (all layers' past lengths are equal in any valid call).
PLUMBING = {"Shape", "Squeeze", "Add", "Concat", "Reshape"}


def _graph(folder):
    import onnx

    return onnx.load(str(folder / "model.onnx"))


def test_replicated_layers_match_a_full_trace(tmp_path, monkeypatch):
    """Four alike layers: two are traced and two copied. Against the eager full trace: the same graph I/O,
    `wide` nodes (names, inputs, attributes), parameters (bytes) and functions; every node of the copy exists
    in the full trace and the only nodes missing are dynamic-shape plumbing; ONNX Runtime still agrees with
    the PyTorch reference."""
    import numpy as np
    from onnx import numpy_helper

    import wide_export.export.onnx_export as onnx_export
    from wide_export.export import replicate
    from wide_export.pipelines.verify import verify_onnx

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    folder = make_checkpoint(tmp_path / "ckpt", arch="llama", num_layers=4, lora=True, tie_word_embeddings=True)
    copied = []
    real = replicate.replicate_layers
    monkeypatch.setattr(replicate, "replicate_layers", lambda m, n: (copied.append(n), real(m, n)))
    _export(folder, tmp_path / "eager", lazy=False, dtype="float16")
    _export(folder, tmp_path / "stream", lazy=True, dtype="float16")
    assert copied == [4]
    full, rep = _graph(tmp_path / "eager"), _graph(tmp_path / "stream")
    assert [v.name for v in rep.graph.input] == [v.name for v in full.graph.input]
    assert [v.name for v in rep.graph.output] == [v.name for v in full.graph.output]
    assert [f.SerializeToString() for f in rep.functions] == [f.SerializeToString() for f in full.functions]

    def wide(m):
        return [(n.name, n.op_type, [i for i in n.input if i.startswith(("model.", "lm_head"))],
                 [a.SerializeToString() for a in n.attribute]) for n in m.graph.node if n.domain == "wide"]

    assert wide(rep) == wide(full) and len(wide(rep)) == 4 * 6
    names_full = {(n.name, n.op_type) for n in full.graph.node}
    names_rep = {(n.name, n.op_type) for n in rep.graph.node}
    assert names_rep <= names_full
    assert {op for _, op in names_full - names_rep} <= PLUMBING

    def params(m, where):
        return {t.name: numpy_helper.to_array(t, base_dir=str(where)) for t in m.graph.initializer
                if t.name.startswith(("model.", "lm_head"))}

    p_full, p_rep = params(full, tmp_path / "eager"), params(rep, tmp_path / "stream")
    assert p_rep.keys() == p_full.keys() and len(p_rep) > 40
    for name, value in p_full.items():
        assert value.dtype == p_rep[name].dtype and np.array_equal(value, p_rep[name]), name
    report = verify_onnx(tmp_path / "stream", steps=2)
    assert report.passed, report.to_dict()


def test_layers_with_different_routing_are_all_traced(tmp_path, monkeypatch):
    from wide_export.checkpoint.router import routers_from_state
    from wide_export.export import replicate
    from wide_export.model.config import WideConfig
    from wide_export.model.synthetic import SyntheticSpec, random_router_state

    spec = SyntheticSpec(num_layers=3)
    cfg = WideConfig.from_hf(spec.hf_config())
    state = random_router_state(spec)
    routers_from_state(state, cfg)
    assert replicate.can_replicate(cfg)
    cfg = WideConfig.from_hf(spec.hf_config())
    routers_from_state({k: v for k, v in state.items() if "layers.2.router_ffn" not in k}, cfg)
    assert not replicate.can_replicate(cfg)  # layer 2's FFN is dense: traced, not copied
    assert not replicate.can_replicate(WideConfig.from_hf(SyntheticSpec(num_layers=2).hf_config()))


def test_sharded_bf16_checkpoint_streams_like_the_eager_export(tmp_path, monkeypatch):
    """The benchmark's checkpoint writer (bf16 shards + index, as the trainer ships): weights spread over
    several shards stream to the same bytes as the eager load."""
    import wide_export.export.onnx_export as onnx_export
    from wide_export.bench.checkpoint_files import write_sharded_checkpoint
    from wide_export.model.synthetic import SyntheticSpec

    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD", 0)
    folder = write_sharded_checkpoint(tmp_path / "ckpt", SyntheticSpec(num_layers=2), shard_bytes=40_000)
    assert len(list(folder.glob("model-*-of-*.safetensors"))) >= 3
    for lazy, name in ((False, "eager"), (True, "stream")):
        export_onnx(load_wide_model(folder, dtype="float16", lazy=lazy), tmp_path / name)
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "stream" / name).read_bytes() == (tmp_path / "eager" / name).read_bytes(), name


def test_cli_streams_verifies_and_records_checksums(tmp_path):
    """`wide-export onnx` on a checkpoint (streamed, 3 alike layers so one is copied, fp16, LoRA): the
    verification against the PyTorch reference passes and wide_config.json carries each source's sha256,
    computed while tracing."""
    import hashlib
    import subprocess
    import sys

    folder = make_checkpoint(tmp_path / "ckpt", arch="llama", num_layers=3, lora=True)
    out = tmp_path / "onnx"
    proc = subprocess.run([sys.executable, "-m", "wide_export", "onnx", "--model", str(folder), "--lora",
                           str(folder / "lora.pth"), "--dtype", "float16", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "PASSED" in proc.stderr, proc.stderr[-3000:]
    sources = json.loads((out / "wide_config.json").read_text())["sources"]
    assert {"config", "router", "lora", "weights:model.safetensors"} <= set(sources)
    for info in sources.values():
        with open(info["path"], "rb") as f:
            assert info["sha256"] == hashlib.sha256(f.read()).hexdigest(), info["path"]
