"""Verification in bounded memory: ONNX Runtime runs the graph one layer slice at a
time, the reference reads its weights module by module. Each piece is checked against something it does
not share code with: the sliced run against ONNX Runtime running the whole graph, the streamed reference
against the eagerly loaded one."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.helpers import assert_one_line_error, make_checkpoint
from wide_export.checkpoint import load_wide_model
from wide_export.export.onnx_export import export_onnx, read_wide_config

LAYERS = 4


def _export(root, dtype):
    """A 4-layer llama checkpoint with LoRA (layers 2, 3 copied by the tracer), exported with external data."""
    import wide_export.export.onnx_export as onnx_export

    ckpt = make_checkpoint(root / "ckpt", arch="llama", num_layers=LAYERS, lora=True, attn_groups=4,
                           ffn_groups=12)
    keep = onnx_export.EXTERNAL_DATA_THRESHOLD
    onnx_export.EXTERNAL_DATA_THRESHOLD = 0
    try:
        export_onnx(load_wide_model(ckpt, lora=ckpt / "lora.pth", dtype=dtype, lazy=True), root / "onnx")
    finally:
        onnx_export.EXTERNAL_DATA_THRESHOLD = keep
    return ckpt, root / "onnx"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("sliced16"), "float16")


@pytest.fixture(scope="module")
def exported32(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("sliced32"), "float32")


def _session_maker(folder, optimize: bool):
    import onnxruntime as ort

    def make(model_bytes: bytes):
        options = ort.SessionOptions()
        if not optimize:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
        return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])

    return make


def _reference(ckpt, *, lazy: bool):
    from wide_export.verify.reference import streamed

    loaded = load_wide_model(ckpt, lora=ckpt / "lora.pth", dtype="float32", lazy=lazy, checksums=False)
    return streamed(loaded) if lazy else loaded.model


def _steps(model, kv_dtype="float16"):
    from wide_export.verify.reference import reference_steps

    return reference_steps(model, batch=2, prompt_len=7, steps=3, seed=0, kv_dtype=kv_dtype)


def _whole_and_sliced(ckpt, folder, optimize: bool):
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from wide_export.verify.compare import run_steps
    from wide_export.export.session import with_masks
    from wide_export.verify.slices import run_sliced

    config = read_wide_config(folder)
    steps = _steps(_reference(ckpt, lazy=False), config["dtype"])
    make = _session_maker(folder, optimize=optimize)
    proto = with_masks(folder, config)
    whole = run_steps(OnnxrtRunner(make(proto.SerializeToString())), steps, LAYERS)
    run = run_sliced(proto, lambda p: make(p.SerializeToString()), [s.feed for s in steps],
                     [{n: v for n, v in s.ref.items() if n.startswith("present.")} for s in steps])
    assert [name for name, _, _ in run.slices] == ["prologue", *(f"layer {i}" for i in range(LAYERS)), "head"]
    assert [set(a) for a in whole] == [set(b) for b in run.outputs]
    assert len([n for n in whole[0] if n.endswith("/mask")]) == 2 * LAYERS
    return whole, run


def test_sliced_run_is_the_whole_graph_run(exported32):
    """Slice by slice, ONNX Runtime computes bit for bit what it computes on the whole graph (float32,
    graph optimizations off): logits, every present and every router mask, over a prefill and 3 decode
    steps that feed back the graph's own presents."""
    whole, run = _whole_and_sliced(*exported32, optimize=False)
    for k, (a, b) in enumerate(zip(whole, run.outputs)):
        for name in a:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), (k, name)
    # a later layer's past is read only for its Shape by the prologue (the graph's past length)
    assert run.borrowed and not any(run.borrowed.values())


def test_sliced_float16_run_differs_from_the_whole_graph_by_rounding_only(exported):
    """float16 on CPU: inside one session ONNX Runtime computes runs of float16 nodes in float32 (the
    casts it inserts) and may skip a rounding that a cut makes; the difference stays a float16 rounding
    (far under the float16 tolerance, 3e-2) and no router decision changes."""
    whole, run = _whole_and_sliced(*exported, optimize=True)
    for a, b in zip(whole, run.outputs):
        for name in a:
            if name.endswith("/mask"):
                assert np.array_equal(a[name], b[name]), name
            else:
                assert np.abs(a[name].astype(np.float32) - b[name].astype(np.float32)).max() < 6e-3, name


def test_each_slice_loads_only_its_own_layers_weights(exported):
    """The memory bound: a layer slice holds that layer's weights and no other layer's, every weight of
    the graph is loaded by exactly one slice, and what slices share are the tracer's small constants."""
    import onnx

    from wide_export.verify.slices import plan_slices

    _, folder = exported
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    pieces = plan_slices(graph)
    seen: list[str] = []
    for piece in pieces:
        names = [t.name for t in piece.initializers]
        seen += names
        layers = {int(m.group(1)) for n in names if (m := re.match(r"model\.layers\.(\d+)\.", n))}
        if piece.name.startswith("layer "):
            assert layers == {int(piece.name.split()[1])}, (piece.name, sorted(layers))
        else:
            assert not layers, piece.name
    weights = sorted(t.name for t in graph.initializer if t.name.startswith(("model.", "lm_head.")))
    assert sorted(n for n in seen if n.startswith(("model.", "lm_head."))) == weights
    assert set(seen) == {t.name for t in graph.initializer}
    shared = {t.name: t for piece in pieces for t in piece.initializers if seen.count(t.name) > 1}
    assert all(int(np.prod(t.dims)) <= 64 for t in shared.values()), sorted(shared)
    assert "model.embed_tokens.weight" in [t.name for t in pieces[0].initializers]
    assert "model.norm.weight" in [t.name for t in pieces[-1].initializers]


def test_streamed_reference_is_the_eager_reference_and_keeps_no_weights(exported):
    """The reference that reads its weights per module gives exactly the eagerly loaded reference's
    logits, presents, masks and margins, and afterwards holds placeholders only."""
    ckpt, _ = exported
    eager = _steps(_reference(ckpt, lazy=False))
    model = _reference(ckpt, lazy=True)
    lazy = _steps(model)
    for a, b in zip(eager, lazy):
        assert set(a.ref) == set(b.ref)
        for name in a.ref:
            assert np.array_equal(a.ref[name], b.ref[name]), name
        for name in a.margins:
            assert np.array_equal(a.margins[name], b.margins[name]), name
    storage = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert storage <= 4 * sum(1 for _ in model.parameters())  # one float32 element each


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "wide_export", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_cli_sliced_verification_passes_and_says_what_it_checked(exported, tmp_path):
    ckpt, folder = exported
    report = tmp_path / "report.json"
    proc = _run_cli("verify", "--onnx", folder, "--model", ckpt, "--lora", ckpt / "lora.pth", "--sliced",
                    "--report", report)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["passed"] and data["settings"]["sliced"] is True
    assert any(f"in {LAYERS + 2} slices" in note for note in data["notes"]), data["notes"]
    assert len(data["decisions"]) == 2 * LAYERS


def test_sliced_verification_fails_on_a_damaged_layer(exported, tmp_path):
    """A wrong weight in one layer (layer 2's down_proj negated in the data file) fails the sliced check."""
    import shutil

    import onnx

    ckpt, folder = exported
    copy = tmp_path / "onnx"
    shutil.copytree(folder, copy)
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    (tensor,) = [t for t in model.graph.initializer if t.name == "model.layers.2.mlp.down_proj.weight"]
    info = {e.key: e.value for e in tensor.external_data}
    offset, length = int(info["offset"]), int(info["length"])
    with open(copy / info["location"], "r+b") as f:
        f.seek(offset)
        data = np.frombuffer(f.read(length), dtype=np.float16)
        f.seek(offset)
        f.write((-data).tobytes())
    proc = _run_cli("verify", "--onnx", copy, "--model", ckpt, "--lora", ckpt / "lora.pth", "--sliced")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "FAILED" in proc.stderr
    assert json.loads((copy / "verify_report.json").read_text())["settings"]["sliced"] is True


def test_auto_choice_follows_available_memory(exported, monkeypatch):
    """Without --sliced/--whole, the whole check runs when it fits in 60 % of the available memory."""
    from wide_export.export import verify_onnx as onnx_verify

    _, folder = exported
    config = read_wide_config(folder)
    stored = sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model.onnx"))
    needed = stored + stored * 2  # float16 export: ONNX Runtime's copy + a float32 reference
    monkeypatch.setattr(onnx_verify, "_available_memory", lambda: int(needed / 0.6) + 4096)
    assert not onnx_verify.needs_slices(folder, config)
    monkeypatch.setattr(onnx_verify, "_available_memory", lambda: int(needed / 0.6) - 4096)
    assert onnx_verify.needs_slices(folder, config)
    monkeypatch.setattr(onnx_verify, "_available_memory", lambda: None)
    assert not onnx_verify.needs_slices(folder, config)


def test_sliced_with_engine_is_refused(tmp_path):
    proc = _run_cli("verify", "--engine", tmp_path, "--sliced")
    line = assert_one_line_error(proc)
    assert "--sliced" in line


def test_streamed_reference_holds_one_module_at_a_time(exported, monkeypatch):
    """Whenever the streamed reference reads a weight, the model holds real weights of one module only."""
    from wide_export.checkpoint.lazy import WeightSource

    ckpt, _ = exported
    model = _reference(ckpt, lazy=True)
    most = [0]
    real = WeightSource.tensor

    def tracked(self, name):
        held = [p for p in model.parameters() if p.untyped_storage().nbytes() > 4]
        most[0] = max(most[0], len(held) + 1)
        return real(self, name)

    monkeypatch.setattr(WeightSource, "tensor", tracked)
    with torch.no_grad():
        ids = torch.tensor([[1, 2, 3]])
        model(ids, torch.ones_like(ids), torch.arange(3)[None], model.empty_cache(1))
    per_layer = max(sum(1 for _ in layer.parameters()) for layer in model.model.layers)
    assert 1 < most[0] <= per_layer, most[0]
