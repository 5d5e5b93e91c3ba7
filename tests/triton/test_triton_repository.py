"""Repository generation: layout, configs parsed as Triton ModelConfig protos,
strict template keys, the tensorrt flavour against an engine manifest, user errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from wide_export.base.errors import WideError
from wide_export.tritonserver import RepoOptions, generate_repository
from wide_export.tritonserver.templates import render, render_text

from tests.triton.engine_manifest import write_engine_folder


def parse_config(path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_onnxruntime_repository_layout_and_config(tiny, tmp_path):
    repo = generate_repository(tmp_path / "repo", onnx=tiny[0],
                               options=RepoOptions(model_name="my_llm", max_batch=3, instances=2))
    version = repo / "my_llm" / "1"
    assert sorted(p.name for p in version.iterdir()) == [
        "contract.py", "decoding.py", "generation.json", "metrics.py", "model.onnx", "model.py", "ortstep.py",
        "rows.py", "settings.py", "textgen.py", "wide_config.json"]
    assert (version / "model.onnx").read_bytes() == (tiny[0] / "model.onnx").read_bytes()
    cfg = parse_config(repo / "my_llm" / "config.pbtxt")
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == ("my_llm", "python", 3)
    assert [(i.name, i.optional) for i in cfg.input] == [
        ("input_ids", True), ("text_input", True), ("add_special_tokens", True), ("max_new_tokens", True),
        ("temperature", True), ("top_p", True), ("seed", True), ("stop_token_ids", True), ("stop_words", True),
        ("ignore_eos", True)]
    assert [o.name for o in cfg.output] == [
        "output_ids", "text_output", "finish_reason", "num_input_tokens", "num_output_tokens"]
    assert cfg.instance_group[0].count == 2
    assert cfg.HasField("dynamic_batching")
    settings = json.loads((version / "generation.json").read_text())
    expected = json.loads((tiny[0] / "wide_config.json").read_text())
    assert settings["num_layers"] == expected["num_layers"]
    assert settings["max_total_tokens"] == expected["max_position_embeddings"]
    assert settings["flavour"] == "onnxruntime"
    assert "wide-export serve" in (repo / "README.md").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]  # no staging folder left behind


def test_template_keys_are_strict():
    text = "a: ${x}\nb: ${y}\n"
    assert render_text(text, {"x": 1, "y": "two"}) == "a: 1\nb: two\n"
    with pytest.raises(KeyError, match=r"missing values \['y'\]"):
        render_text(text, {"x": 1})
    with pytest.raises(KeyError, match=r"unknown keys \['z'\]"):
        render_text(text, {"x": 1, "y": 2, "z": 3})
    with pytest.raises(TypeError):
        render_text(text, {"x": None, "y": 2})
    with pytest.raises(ValueError, match="malformed"):
        render_text("a: ${x", {"x": 1})
    with pytest.raises(KeyError):
        render("generation.pbtxt", model_name="m")


def test_errors_leave_nothing_behind(tiny, tmp_path):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("x")
    with pytest.raises(WideError, match="not empty"):
        generate_repository(occupied, onnx=tiny[0])
    with pytest.raises(WideError, match="exactly one"):
        generate_repository(tmp_path / "r", onnx=tiny[0], engines=tiny[0])
    with pytest.raises(WideError, match="needs --engines"):
        generate_repository(tmp_path / "r", onnx=tiny[0], backend="tensorrt")
    with pytest.raises(WideError, match="model name"):
        generate_repository(tmp_path / "r", onnx=tiny[0], options=RepoOptions(model_name="bad name"))
    broken = tmp_path / "broken"
    shutil.copytree(tiny[0], broken)
    cfg = json.loads((broken / "wide_config.json").read_text())
    cfg["num_layers"] += 1  # the graph has fewer KV inputs than the config says
    (broken / "wide_config.json").write_text(json.dumps(cfg))
    with pytest.raises(WideError, match="KV-cache contract"):
        generate_repository(tmp_path / "r", onnx=broken)
    (broken / "wide_config.json").unlink()
    with pytest.raises(WideError, match="wide_config.json not found"):
        generate_repository(tmp_path / "r", onnx=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "occupied"]


# ---------------------------------------------------------------- tensorrt flavour
TRITON_TYPE = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}


def assert_plan_configs_match(repo: Path, engine_dir: Path, engine: dict) -> None:
    """One tensorrt_plan model holds the engine once, its I/O exactly, and one GPU instance
    group listing every profile (Triton picks the profile per request by shape)."""
    from tritonclient.grpc import model_config_pb2

    plans = sorted(p.parent.parent.name for p in repo.glob("*/1/model.plan"))
    assert plans == ["wide_llm_engine"]  # the engine's weights go on the GPU once
    model = repo / "wide_llm_engine"
    assert (model / "1" / "model.plan").read_bytes() == (engine_dir / engine["file"]).read_bytes()
    cfg = parse_config(model / "config.pbtxt")
    assert (cfg.platform, cfg.max_batch_size) == ("tensorrt_plan", 0)
    for got, want in ((cfg.input, engine["inputs"]), (cfg.output, engine["outputs"])):
        assert [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in got] == [
            (t["name"], TRITON_TYPE[t["dtype"]], t["shape"]) for t in want]
    assert [p["name"] for p in engine["profiles"]] == ["prefill", "decode"]
    # count 1: the backend deserializes the plan per instance (dynamic shapes are not shared)
    assert [(g.count, list(g.profile)) for g in cfg.instance_group] == [(1, ["0", "1"])]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_tensorrt_repository_matches_the_manifest(tmp_path):
    manifest = write_engine_folder(tmp_path / "engines")
    repo = generate_repository(tmp_path / "repo", engines=tmp_path / "engines",
                               options=RepoOptions(max_batch=8, instances=3))
    assert_plan_configs_match(repo, tmp_path / "engines", manifest["engines"][0])
    assert parse_config(repo / "wide_llm" / "config.pbtxt").instance_group[0].count == 3  # generation model only
    gen = parse_config(repo / "wide_llm" / "config.pbtxt")
    assert (gen.backend, gen.max_batch_size) == ("python", 4)  # capped by the prefill profile's batch
    settings = json.loads((repo / "wide_llm" / "1" / "generation.json").read_text())
    assert settings["engine_model"] == "wide_llm_engine" and "prefill_model" not in settings
    assert settings["kv_cache_memory"] == "gpu"
    assert settings["kv_dtype"] == "float16"
    assert settings["max_total_tokens"] == 1024 and settings["max_prompt_tokens"] == 256
    readme = (repo / "README.md").read_text()
    assert "--backend-config=tensorrt,plugins=" in readme and "LD_PRELOAD" in readme
    assert "tensorrt_rtx 1.7.1" in readme
    assert (repo / "libwide_plugins.so").is_file()


def test_tensorrt_manifest_errors(tmp_path):
    manifest = write_engine_folder(tmp_path / "engines", layers=2)
    path = tmp_path / "engines" / "wide_engine.json"
    bad = json.loads(json.dumps(manifest))
    bad["engines"][0]["inputs"] = bad["engines"][0]["inputs"][:-1]  # lose one KV input
    path.write_text(json.dumps(bad))
    with pytest.raises(WideError, match="KV-cache|layers|unknown inputs"):
        generate_repository(tmp_path / "r", engines=tmp_path / "engines")
    bad = json.loads(json.dumps(manifest))
    bad["engines"][0]["inputs"][0]["dtype"] = "complex64"
    path.write_text(json.dumps(bad))
    with pytest.raises(WideError, match="unsupported dtype"):
        generate_repository(tmp_path / "r", engines=tmp_path / "engines")
    bad = json.loads(json.dumps(manifest))
    bad["engines"][0]["profiles"] = bad["engines"][0]["profiles"][1:]  # decode only
    path.write_text(json.dumps(bad))
    with pytest.raises(WideError, match="prefill"):
        generate_repository(tmp_path / "r", engines=tmp_path / "engines")
    path.unlink()
    with pytest.raises(WideError, match="wide_engine.json not found"):
        generate_repository(tmp_path / "r", engines=tmp_path / "engines")
    assert not (tmp_path / "r").exists()


@pytest.mark.trt
def test_tensorrt_repository_from_a_real_engine(demo_onnx, tmp_path):
    """`wide-export trt`'s real engine + manifest (TensorRT-RTX builds on CPU) -> configs."""
    from wide_export.trt.build_engines import build_engine

    manifest = build_engine(demo_onnx, tmp_path / "engine")
    repo = generate_repository(tmp_path / "repo", engines=tmp_path / "engine")
    assert_plan_configs_match(repo, tmp_path / "engine", manifest["engines"][0])
    settings = json.loads((repo / "wide_llm" / "1" / "generation.json").read_text())
    limits = manifest["limits"]
    assert settings["max_total_tokens"] == min(limits["max_seq_len"], manifest["model"]["max_position_embeddings"])
    assert settings["max_prompt_tokens"] == limits["max_input_len"]
    assert parse_config(repo / "wide_llm" / "config.pbtxt").max_batch_size == min(8, limits["max_batch"])
    assert manifest["tensorrt"]["version"] in (repo / "README.md").read_text()


def test_tensorrt_rtx_engines_are_warned_about_before_writing(tmp_path, capsys):
    """Triton's tensorrt backend cannot load TensorRT-RTX engines: said at generation time, not at serve."""
    write_engine_folder(tmp_path / "engines")  # the manifest says tensorrt_rtx 1.7.1
    generate_repository(tmp_path / "repo", engines=tmp_path / "engines")
    err = capsys.readouterr().err
    assert "holds TensorRT-RTX engines (tensorrt_rtx 1.7.1)" in err and "cannot load them" in err
    assert len(err.strip().splitlines()) == 1


def test_engines_with_the_onnxruntime_backend_get_a_hint(tmp_path):
    from typer.testing import CliRunner

    from tests.helpers import assert_one_line_error
    from wide_export.cli import app

    write_engine_folder(tmp_path / "engines")
    result = CliRunner().invoke(app, ["triton", "--engines", str(tmp_path / "engines"), "--backend", "onnxruntime",
                                      "--output", str(tmp_path / "repo")])
    line = assert_one_line_error(result)
    said, hint = line.split(" (hint: ", 1)
    assert "onnxruntime" in said and "--onnx" in said and "--engines" in said and "--onnx" in hint, line
    assert not (tmp_path / "repo").exists()
