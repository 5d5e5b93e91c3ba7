"""ONNX export against the PyTorch reference over architectures, sparse targets and group sizes.

Each case writes a real checkpoint (HF folder + router.pth [+ lora.pth]), loads
it through the CLI's loader, exports, and verifies ONNX Runtime against the
reference over a left-padded batch of 2: a prefill and 3 decode steps fed with
the graph's own `present` outputs (wide_export.verify).
"""

from __future__ import annotations

import json

import onnx
import pytest

from tests.helpers import make_checkpoint
from wide_export.checkpoint import load_wide_model
from wide_export.ops.io_spec import input_names, output_names
from wide_export.export.onnx_export import export_onnx
from wide_export.pipelines.verify import verify_onnx

# heads 8 / kv 2 / hidden 64 / intermediate 192 unless stated
CASES = {
    "llama-all-attnG1-ffnG4-lora-tied": dict(arch="llama", sparse_target="all", attn_groups=8, ffn_groups=48,
                                             lora=True, tie_word_embeddings=True),
    "llama-attention-attnG2": dict(arch="llama", sparse_target="attention", attn_groups=4),
    "llama-ffn-ffnG96": dict(arch="llama", sparse_target="ffn", ffn_groups=2),
    "qwen2-all-attnG4-ffnG16": dict(arch="qwen2", sparse_target="all", attn_groups=2, ffn_groups=12),
    "qwen2-attention-onegroup": dict(arch="qwen2", sparse_target="attention", attn_groups=1),
    "qwen2-ffn-ffnG8": dict(arch="qwen2", sparse_target="ffn", ffn_groups=24),
    "qwen3-all-onegroup-each": dict(arch="qwen3", head_dim=16, sparse_target="all", attn_groups=1, ffn_groups=1),
    "qwen3-attention-attnG1": dict(arch="qwen3", head_dim=16, sparse_target="attention", attn_groups=8),
    "qwen3-ffn-ffnG2": dict(arch="qwen3", head_dim=16, sparse_target="ffn", ffn_groups=96),
    "mistral-all": dict(arch="mistral", sparse_target="all"),
}


def _routed_layers(spec_kw):
    target = spec_kw.get("sparse_target", "all")
    return {"attention": target in ("all", "attention"), "ffn": target in ("all", "ffn")}


@pytest.mark.parametrize("name", list(CASES))
def test_export_matches_reference(tmp_path, name):
    kw = dict(CASES[name])
    folder = make_checkpoint(tmp_path / "ckpt", **kw)
    lora = folder / "lora.pth" if kw.get("lora") else None
    loaded = load_wide_model(folder, lora=lora)
    out = tmp_path / "onnx"
    result = export_onnx(loaded, out)

    report = verify_onnx(out, loaded=loaded, steps=3, batch=2, prompt_len=7)
    assert report.passed, report.to_dict()
    routed = _routed_layers(kw)
    n_layers = loaded.config.num_layers
    assert len(report.decisions) == n_layers * sum(routed.values())
    assert {r.name for r in report.outputs} == set(output_names(n_layers))

    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == input_names(n_layers)
    assert [o.name for o in model.graph.output] == output_names(n_layers)
    wide = [n for n in model.graph.node if n.domain == "wide"]
    expected = {
        "WideRouter": n_layers * sum(routed.values()),
        "WideMaskedGemmN": n_layers * routed["attention"],
        "WideMaskedGatedMlp": n_layers * routed["ffn"],
        "WideMaskedGemmK": n_layers * sum(routed.values()),
    }
    assert {op: sum(n.op_type == op for n in wide) for op in expected} == expected == result.wide_nodes
    for node in wide:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["plugin_version"] == b"1" and attrs["plugin_namespace"] == b""
        assert node.name.startswith("/model/layers.")
    assert {f.name for f in model.functions} == {"WideRouter", "WideMaskedGemmN", "WideMaskedGatedMlp",
                                                 "WideMaskedGemmK"}
    # K/V projections stay dense standard ops: no wide node consumes k_proj / v_proj weights
    assert not any("k_proj" in i or "v_proj" in i for n in wide for i in n.input)

    cfg = json.loads((out / "wide_config.json").read_text())
    assert cfg["architecture"] == kw["arch"] and cfg["num_layers"] == n_layers
    for layer in cfg["layers"]:
        assert (layer["attention"] is not None) == routed["attention"]
        assert (layer["ffn"] is not None) == routed["ffn"]
    assert set(cfg["sources"]) >= {"config", "router", "weights:model.safetensors"}
    assert all(len(s["sha256"]) == 64 for s in cfg["sources"].values())


def test_float16_export_loads_runs_and_verifies(tmp_path):
    loaded = load_wide_model(None, dtype="float16")
    out = tmp_path / "fp16"
    export_onnx(loaded, out)
    model = onnx.load(str(out / "model.onnx"))
    past = next(i for i in model.graph.input if i.name == "past_key_values.0.key")
    assert past.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    router_w = next(t for t in model.graph.initializer if t.name.endswith("router_ffn.router.weight"))
    assert router_w.data_type == onnx.TensorProto.FLOAT  # routers stay float32
    report = verify_onnx(out, steps=3)
    assert report.passed, report.to_dict()
    assert all(r.agreement >= 0.95 for r in report.decisions)


def test_lora_merge_changes_weights_as_documented(tmp_path):
    import torch

    folder = make_checkpoint(tmp_path, arch="llama", lora=True)
    base = load_wide_model(folder).model
    merged = load_wide_model(folder, lora=folder / "lora.pth", lora_scale=2.0).model
    lora = torch.load(folder / "lora.pth", weights_only=True)
    a = lora["base_model.model.model.layers.1.mlp.down_proj.lora_A.default.weight"]
    b = lora["base_model.model.model.layers.1.mlp.down_proj.lora_B.default.weight"]
    want = base.model.layers[1].mlp.down_proj.weight + (b @ a) * 2.0
    torch.testing.assert_close(merged.model.layers[1].mlp.down_proj.weight, want)
    torch.testing.assert_close(merged.model.layers[0].self_attn.k_proj.weight,
                               base.model.layers[0].self_attn.k_proj.weight)  # no LoRA there
