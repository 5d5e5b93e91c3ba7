"""`wide-export vllm`: the folder's config, weights and text files, checked against the checkpoint's own files
read by hand (torch.load / safetensors), and its refusals. No vLLM needed (runs in the main test environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error, make_checkpoint


def _run(*args: str):
    from wide_export.cli import app

    return CliRunner().invoke(app, ["vllm", *args])


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def _base(ckpt: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as st:
        return {k: st.get_tensor(k) for k in st.keys()}


def _routers_by_hand(ckpt: Path) -> dict[str, torch.Tensor]:
    """router.pth's tensors under their model.layers.* names (the wrapper prefix cut by hand)."""
    state = torch.load(ckpt / "router.pth", weights_only=True)
    return {k[k.index("model.layers."):]: v for k, v in state.items()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    folder = make_checkpoint(tmp_path_factory.mktemp("vllm") / "ckpt", arch="llama", num_heads=4, num_kv_heads=2,
                             head_dim=32, hidden_size=128, attn_groups=2, ffn_groups=12, attention_bias=True,
                             lora=True, seed=11)
    write_demo_tokenizer(folder)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7]}))
    return folder


def test_folder_holds_merged_weights_float32_routers_and_the_text_files(ckpt, tmp_path):
    out = tmp_path / "out"
    result = _run("--model", str(ckpt), "--lora", str(ckpt / "lora.pth"), "--output", str(out))
    assert result.exit_code == 0, result.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["WideLlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["dtype"] == "float32" and cfg["attention_bias"] is True
    # the section, against router.pth's shapes read by hand: [R, H], [2G, R]
    routers = _routers_by_hand(ckpt)
    wide = cfg["wide"]
    assert wide["format"] == "wide-export/vllm" and wide["version"] == 1
    for i, layer in enumerate(wide["layers"]):
        for kind, width in (("attention", 4), ("ffn", 192)):
            rw = routers[f"model.layers.{i}.router_{kind}.router.weight"]
            cw = routers[f"model.layers.{i}.router_{kind}.compressor.weight"]
            assert layer[kind]["groups"] == rw.shape[0] // 2 and layer[kind]["rank"] == cw.shape[0]
        assert layer["attention"]["heads_per_group"] == 4 // (routers[f"model.layers.{i}.router_attention."
                                                                       "router.weight"].shape[0] // 2)
    assert wide["tensor_parallel_sizes"] == [1, 2]  # kv heads 2, attention groups 2, FFN groups 12
    assert wide["lora"] == {"merged_pairs": 8, "scale": 2.0}
    got = _tensors(out)
    for name, tensor in routers.items():  # bf16 in the file, float32 in the folder, same values
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor.float()), name
    # LoRA merged by hand: W + (B @ A) * 2
    lora = {k[k.index("model.layers."):]: v for k, v in torch.load(ckpt / "lora.pth", weights_only=True).items()}
    base = _base(ckpt)
    for proj in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
        a = lora[f"model.layers.1.{proj}.lora_A.default.weight"]
        b = lora[f"model.layers.1.{proj}.lora_B.default.weight"]
        want = base[f"model.layers.1.{proj}.weight"] + (b @ a) * 2.0
        torch.testing.assert_close(got[f"model.layers.1.{proj}.weight"], want, rtol=0, atol=1e-6)
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.o_proj.bias", "lm_head.weight"):
        assert torch.equal(got[name], base[name]), name
    assert set(got) == set(base) | set(routers)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (ckpt / name).read_bytes(), name
    assert (ckpt / "config.json").exists() and "wide" not in json.loads((ckpt / "config.json").read_text())


def test_shards_and_index_hold_the_same_tensors(ckpt, tmp_path):
    from wide_export.checkpoint import load_wide_model
    from wide_export.vllm.export import export_vllm

    loaded = load_wide_model(ckpt, lazy=True, checksums=False)
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir()
    many.mkdir()
    export_vllm(loaded, one, "float32")
    summary = export_vllm(loaded, many, "float32", max_shard_bytes=200_000)
    assert len(summary["weights"]) > 3 and summary["weights"][-1] == "model.safetensors.index.json"
    index = json.loads((many / "model.safetensors.index.json").read_text())
    a, b = _tensors(one), _tensors(many)
    assert set(index["weight_map"]) == set(b) == set(a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in b.values())


def test_dtype_tied_embeddings_and_one_router_kind(tmp_path):
    ckpt = make_checkpoint(tmp_path / "q2", arch="qwen2", num_heads=4, num_kv_heads=2, head_dim=32,
                           sparse_target="ffn", tie_word_embeddings=True, seed=5)
    out = tmp_path / "out"
    result = _run("--model", str(ckpt), "--output", str(out), "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["WideQwen2ForCausalLM"] and cfg["dtype"] == "bfloat16"
    assert all(layer["attention"] is None and layer["ffn"]["groups"] == 12 for layer in cfg["wide"]["layers"])
    got = _tensors(out)
    assert "lm_head.weight" not in got  # tied: vLLM ties it to the embedding, as transformers
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert got["model.layers.0.router_ffn.router.weight"].dtype == torch.float32
    assert not any(".router_attention." in k for k in got)


def test_demo_model_without_model(tmp_path):
    out = tmp_path / "demo"
    result = _run("--output", str(out))
    assert result.exit_code == 0, result.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["WideLlamaForCausalLM"] and cfg["wide"]["demo"] is True
    assert (out / "tokenizer.json").is_file()
    assert "head_dim 8" in result.output  # the note: vLLM's CPU attention does not take it


@pytest.mark.parametrize("args,needle", [
    (["--dtype", "int8"], "unsupported --dtype int8"),
    (["--model", "/nonexistent/folder"], "model folder not found"),
    (["--router", "x.pth"], "no router file: x.pth does not exist"),  # checked as --router is parsed
    (["--router", __file__], "--router/--lora need --model"),  # a file that is there, without its --model
    (["--attn-group-size", "3"], "--attn-group-size=3 disagrees"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, needle):
    out = tmp_path / "out"
    result = _run(*args, "--output", str(out))
    line = assert_one_line_error(result)
    assert needle in line
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_without_force(ckpt, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    line = assert_one_line_error(_run("--model", str(ckpt), "--output", str(out)))
    assert "already exists" in line and (out / "keep").read_text() == "x"


# ---- the section as the plugin reads it (spec.config_from_hf), without vLLM ---------------------------------
def _hf(folder: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def folder(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("folder") / "out"
    assert _run("--model", str(ckpt), "--output", str(out)).exit_code == 0
    return out


def _edited(folder: Path, tmp_path: Path, edit) -> Path:
    import shutil

    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    cfg = json.loads((copy / "config.json").read_text())
    edit(cfg)
    (copy / "config.json").write_text(json.dumps(cfg))
    return copy


def test_section_reads_back_as_the_routing(folder):
    from wide_export.vllm.spec import config_from_hf

    cfg = config_from_hf(_hf(folder))
    assert [(r.attn_groups, r.attn_rank, r.ffn_groups, r.ffn_rank) for r in cfg.routing] == [(2, 16, 12, 16)] * 2
    assert cfg.attn_group_size(0) == 2 and cfg.ffn_group_size(1) == 16 and cfg.o_bias and cfg.qkv_bias


def _set_layer0_ffn_groups(cfg):
    cfg["wide"]["layers"][0]["ffn"]["groups"] = 7


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.pop("wide"), "no `wide` section"),
    (lambda c: c["wide"].update(version=9), "version 9"),
    (lambda c: c["wide"]["layers"].pop(), "describes 1 layers, config.json has 2"),
    (_set_layer0_ffn_groups, "7 groups do not divide the 192 FFN channels"),
    (lambda c: c.update(architectures=["WideQwen3ForCausalLM"]), "a llama WIDE folder is ['WideLlamaForCausalLM']"),
    (lambda c: c["wide"]["layers"][1]["attention"].update(rank=0), "rank is 0, not a positive integer"),
])
def test_mismatched_section_is_refused(folder, tmp_path, edit, needle):
    from wide_export.base.errors import WideError
    from wide_export.vllm.spec import config_from_hf

    with pytest.raises(WideError) as err:
        config_from_hf(_hf(_edited(folder, tmp_path, edit)))
    assert needle in str(err.value) and "wide-export vllm" in str(err.value)


def test_world_sizes_that_split_a_group_are_refused(folder):
    from wide_export.base.errors import WideError
    from wide_export.vllm.spec import check_world, config_from_hf, tp_sizes

    cfg = config_from_hf(_hf(folder))
    check_world(cfg, 2)
    with pytest.raises(WideError) as err:
        check_world(cfg, 4)  # 2 KV heads
    assert "tensor_parallel_size 4 " in str(err.value) and "num_key_value_heads=2" in str(err.value)
    assert "runs at tensor_parallel_size 1, 2" in str(err.value)
    cfg.routing[1].ffn_groups = 6  # 6 groups of 32: 4 ranks would need 1.5 groups each
    cfg.num_key_value_heads = cfg.num_attention_heads = 4
    cfg.routing[0].attn_groups = cfg.routing[1].attn_groups = 4
    assert tp_sizes(cfg) == [1, 2]
