"""Engine builds with TensorRT-RTX (or TensorRT) on this machine: the demo model, the
manifest, the plugin-layer report, one-op networks and the error paths of `wide-export trt`.

Without $WIDE_TRT_PLUGIN_LIB (CI: no TensorRT headers, so no plugin library) the
`wide` nodes are inlined from their function bodies; with it, every one of them
must become a plugin layer.
"""

from __future__ import annotations

import hashlib
import json
import sys

import onnx
import pytest
from typer.testing import CliRunner

from wide_export.base.errors import WideError
from wide_export.trt.plugins import PLUGIN_NAMES
from tests.helpers import assert_one_line_error, signal_when_ready

pytestmark = pytest.mark.trt

SMALL = ["--max-batch", "2", "--max-input-len", "16", "--max-seq-len", "32"]


def _app():
    from wide_export.cli import app

    return app


def _wide_nodes(onnx_dir):
    """(name, op_type) of the `wide` nodes, read from the ONNX file itself."""
    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    return sorted((n.name, n.op_type) for n in model.graph.node if n.domain == "wide")


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def inlined_build(demo_onnx, tmp_path_factory):
    """`wide-export trt` on the demo ONNX without plugins (the CI configuration)."""
    out = tmp_path_factory.mktemp("engine") / "out"
    cache = out.parent / "shared.cache"
    result = CliRunner().invoke(_app(), ["trt", "--onnx", str(demo_onnx), "--output", str(out),
                                         "--timing-cache", str(cache), *SMALL], env={"WIDE_TRT_PLUGIN_LIB": ""})
    assert result.exit_code == 0, result.output
    return out, result.output, cache


def test_demo_engine_manifest(inlined_build, demo_onnx):
    out, _, cache = inlined_build
    manifest = json.loads((out / "wide_engine.json").read_text())
    assert manifest["tensorrt"]["package"] in ("tensorrt", "tensorrt_rtx")
    assert manifest["tensorrt"]["version"][:1].isdigit()
    assert manifest["precision"] == "float32" and manifest["strongly_typed"]
    assert manifest["plugins"] == [] and manifest["plugin_library"] is None
    (engine,) = manifest["engines"]
    assert (out / engine["file"]).stat().st_size == engine["size_bytes"] > 0
    assert _sha256(out / engine["file"]) == engine["sha256"]
    config = json.loads((demo_onnx / "wide_config.json").read_text())
    names_in = [t["name"] for t in engine["inputs"]]
    names_out = [t["name"] for t in engine["outputs"]]
    assert names_in == [t["name"] for t in config["io"]["inputs"]]
    assert names_out == [t["name"] for t in config["io"]["outputs"]]
    dtypes = {t["name"]: t["dtype"] for t in engine["inputs"] + engine["outputs"]}
    assert dtypes["input_ids"] == "int64" and dtypes["logits"] == "float32"
    assert dtypes["present.0.key"] == "float32"
    logits = next(t for t in engine["outputs"] if t["name"] == "logits")
    assert logits["shape"][-1] == config["vocab_size"]
    prefill, decode = engine["profiles"]
    assert (prefill["name"], prefill["index"], decode["name"], decode["index"]) == ("prefill", 0, "decode", 1)
    assert prefill["shapes"]["past_key_values.0.key"]["max"][2] == 0
    assert prefill["shapes"]["input_ids"]["max"] == [2, 16]
    assert decode["shapes"]["input_ids"]["max"] == [2, 1]
    assert decode["shapes"]["attention_mask"]["max"] == [2, 32]
    assert manifest["limits"] == {"max_batch": 2, "max_input_len": 16, "max_seq_len": 32}
    assert (out / "wide_config.json").read_text() == (demo_onnx / "wide_config.json").read_text()
    assert cache.is_file() and cache.stat().st_size > 0  # written for the next build to reuse


def test_demo_engine_inlines_every_wide_node_without_plugins(inlined_build, demo_onnx):
    out, output, _ = inlined_build
    nodes = _wide_nodes(demo_onnx)
    assert nodes, "the demo export has no wide nodes"
    report = json.loads((out / "wide_engine.json").read_text())["wide_nodes"]
    assert (report["total"], report["plugin_layers"], report["inlined"]) == (len(nodes), 0, len(nodes))
    assert sorted((n["name"], n["op_type"]) for n in report["nodes"]) == nodes
    assert {n["became"] for n in report["nodes"]} == {"inlined_function"}
    assert "inlined" in output and "no plugin library loaded" in output


def test_timing_cache_is_reused(inlined_build, demo_onnx, tmp_path):
    from wide_export.trt.build_engines import build_engine

    _, _, cache = inlined_build
    before = cache.read_bytes()
    manifest = build_engine(demo_onnx, tmp_path / "again", timing_cache=cache, progress=False,
                            limits={"max_batch": 2, "max_input_len": 16, "max_seq_len": 32})
    assert manifest["timing_cache"] == str(cache)
    assert len(cache.read_bytes()) >= len(before) > 0
    assert not (tmp_path / "again" / "timing.cache").exists()


def test_every_wide_node_becomes_a_plugin_layer(demo_onnx, plugin_lib, tmp_path):
    from wide_export.trt.build_engines import build_engine

    out = tmp_path / "engine"
    manifest = build_engine(demo_onnx, out, plugins=plugin_lib, progress=False, mask_outputs=True,
                            limits={"max_batch": 2, "max_input_len": 16, "max_seq_len": 32})
    nodes = _wide_nodes(demo_onnx)
    report = manifest["wide_nodes"]
    assert (report["total"], report["plugin_layers"], report["inlined"]) == (len(nodes), len(nodes), 0)
    assert {n["became"] for n in report["nodes"]} == {"plugin_layer"}
    lib = manifest["plugin_library"]
    assert lib["sha256"] == _sha256(plugin_lib) == _sha256(out / lib["file"])
    assert set(lib["creators"]) == set(PLUGIN_NAMES)
    assert manifest["plugins"] == [lib["file"]]
    outputs = {t["name"] for t in manifest["engines"][0]["outputs"]}
    assert set(manifest["mask_outputs"]) <= outputs and manifest["mask_outputs"]


@pytest.mark.parametrize("op", sorted(PLUGIN_NAMES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_op_network_builds_as_plugin_layer(op, dtype, plugin_lib, tmp_path):
    from wide_export.trt.oneop import build_one_op_engine, one_op_model

    model, _ = one_op_model(op, dtype=dtype, has_bias=op in ("WideMaskedGemmN", "WideMaskedGemmK"))
    onnx.save(model, str(tmp_path / "m.onnx"))
    info = build_one_op_engine(tmp_path / "m.onnx", tmp_path / "m.engine", plugins=plugin_lib)
    assert info["plugin_layers"] == 1 and info["layers"].count("PLUGIN_V3") == 1
    assert (tmp_path / "m.engine").stat().st_size > 0


@pytest.mark.parametrize("op", sorted(PLUGIN_NAMES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_one_op_network_inlines_without_plugins(op, dtype, tmp_path):
    from wide_export.trt.oneop import build_one_op_engine, one_op_model

    model, _ = one_op_model(op, dtype=dtype)
    onnx.save(model, str(tmp_path / "m.onnx"))
    info = build_one_op_engine(tmp_path / "m.onnx", tmp_path / "m.engine")
    assert info["plugin_layers"] == 0 and "PLUGIN_V3" not in info["layers"] and len(info["layers"]) > 3


def _run_cli(args):
    return CliRunner().invoke(_app(), ["trt", *args], env={"WIDE_TRT_PLUGIN_LIB": ""})


def test_missing_onnx_is_a_user_error(tmp_path):
    result = _run_cli(["--onnx", str(tmp_path / "none"), "--output", str(tmp_path / "out")])
    assert "model.onnx not found" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()


def test_contradictory_limits_are_a_user_error(demo_onnx, tmp_path):
    result = _run_cli(["--onnx", str(demo_onnx), "--output", str(tmp_path / "out"),
                       "--max-input-len", "64", "--max-seq-len", "32"])
    assert "contradict" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "not-elf", "not-loadable"])
def test_plugin_library_that_fails_to_load(demo_onnx, tmp_path, kind):
    lib = {"missing": tmp_path / "nope.so", "not-elf": tmp_path / "text.so",
           "not-loadable": tmp_path / "python.so"}[kind]
    if kind == "not-elf":
        lib.write_text("not a library")
    if kind == "not-loadable":  # an ELF executable: dlopen refuses it
        lib.write_bytes(open(sys.executable, "rb").read())
    result = _run_cli(["--onnx", str(demo_onnx), "--output", str(tmp_path / "out"), "--plugins", str(lib), *SMALL])
    assert_one_line_error(result)
    expected = {"missing": "not found", "not-elf": "not a shared library", "not-loadable": "failed to load"}[kind]
    assert expected in result.output
    assert not (tmp_path / "out").exists()


def test_fp16_engine_from_a_float32_export(demo_onnx, tmp_path):
    """`wide-export onnx` (float32) then `wide-export trt --fp16`: the graph is converted, the engine is fp16
    with the I/O of an fp16 export (KV cache float16, logits float32), and no temp folder is left."""
    result = _run_cli(["--onnx", str(demo_onnx), "--output", str(tmp_path / "out"), "--fp16", *SMALL])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "wide_engine.json").read_text())
    assert manifest["precision"] == "float16" and manifest["strongly_typed"]
    assert manifest["fp16_conversion"]["from"] == "float32"
    engine = manifest["engines"][0]
    dtypes = {t["name"]: t["dtype"] for t in engine["inputs"] + engine["outputs"]}
    assert dtypes["past_key_values.0.key"] == dtypes["present.2.value"] == "float16"
    assert dtypes["logits"] == "float32" and dtypes["input_ids"] == "int64"
    assert json.loads((tmp_path / "out" / "wide_config.json").read_text())["dtype"] == "float16"
    assert json.loads((demo_onnx / "wide_config.json").read_text())["dtype"] == "float32"  # input untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unknown_backend(demo_onnx, tmp_path):
    with pytest.raises(WideError, match="unknown TensorRT backend"):
        from wide_export.trt.backend import select_backend

        select_backend("onnxruntime")


def test_verify_engine_error_paths(inlined_build, tmp_path):
    from wide_export.trt.backend import has_gpu

    result = CliRunner().invoke(_app(), ["verify", "--engine", str(tmp_path / "none")])
    assert "wide_engine.json not found" in assert_one_line_error(result)
    out, _, _ = inlined_build
    result = CliRunner().invoke(_app(), ["verify", "--engine", str(out), "--batch", "3",
                                         "--report", str(tmp_path / "r.json")])
    assert "exceed the engine's limits" in assert_one_line_error(result)
    if not has_gpu():
        result = CliRunner().invoke(_app(), ["verify", "--engine", str(out), "--report", str(tmp_path / "r.json")])
        assert "needs a CUDA GPU" in assert_one_line_error(result)
        assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_fp16_demo_engine(tmp_path):
    """`wide-export onnx --dtype float16` then `wide-export trt --fp16`: a strongly typed fp16 engine."""
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx

    export_onnx(load_wide_model(None, dtype="float16"), tmp_path / "onnx")
    result = _run_cli(["--onnx", str(tmp_path / "onnx"), "--output", str(tmp_path / "out"), "--fp16", *SMALL])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "wide_engine.json").read_text())
    assert manifest["precision"] == "float16" and manifest["strongly_typed"]
    dtypes = {t["name"]: t["dtype"] for t in manifest["engines"][0]["inputs"]}
    assert dtypes["past_key_values.0.key"] == "float16"


@pytest.mark.parametrize("group_size, message", [(0, "group_size must be > 0"), (5, "not a multiple of group_size")])
def test_plugin_reports_bad_fields(plugin_lib, tmp_path, capfd, group_size, message):
    """Errors inside the plugin's noexcept methods are reported (TensorRT log) and fail the build cleanly."""
    from wide_export.trt.oneop import build_one_op_engine, one_op_model

    model, _ = one_op_model("WideMaskedGemmK", k=64, n=48, group_size=16)
    attr = next(a for a in model.graph.node[0].attribute if a.name == "group_size")
    attr.i = group_size
    model.functions.pop()  # no function body to fall back to: the plugin must be used
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(WideError):
        build_one_op_engine(tmp_path / "m.onnx", tmp_path / "m.engine", plugins=plugin_lib)
    captured = capfd.readouterr()
    assert message in captured.out + captured.err  # the TensorRT logger (via setLoggerFinder)
    assert not (tmp_path / "m.engine").exists()


def test_existing_output_or_input_folder_is_refused(demo_onnx, tmp_path):
    """An existing folder that is not an engine folder needs --force; the ONNX folder is never replaced."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = _run_cli(["--onnx", str(demo_onnx), "--output", str(mine), *SMALL])
    assert "already exists" in assert_one_line_error(result)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    before = sorted(p.name for p in demo_onnx.iterdir())
    result = _run_cli(["--onnx", str(demo_onnx), "--output", str(demo_onnx), "--force", *SMALL])
    assert "would replace your input" in assert_one_line_error(result)
    assert sorted(p.name for p in demo_onnx.iterdir()) == before


def test_backend_spellings_of_the_readme(monkeypatch):
    """`--backend tensorrt-rtx` / `auto` as README.md spells them reach select_backend's import."""
    from wide_export.trt import backend

    imported = []
    monkeypatch.setattr(backend.importlib.util, "find_spec", lambda name: object())  # every flavour "installed"
    monkeypatch.setattr(backend, "_import", lambda package: imported.append(package) or object())
    assert backend.select_backend("tensorrt-rtx").package == "tensorrt_rtx"
    assert backend.select_backend("auto").package == "tensorrt"
    assert imported == ["tensorrt_rtx", "tensorrt"]
    with pytest.raises(WideError, match="unknown TensorRT backend 'tensorrt-llm'"):
        backend.select_backend("tensorrt-llm")


# ---- an attention_bias checkpoint, and bfloat16 engines ---------------------------------------------
@pytest.fixture(scope="module")
def bias_exports(tmp_path_factory):
    """(bf16 export, float32 export) of a Llama checkpoint with attention_bias: true (o_proj has a bias)."""
    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx

    tmp = tmp_path_factory.mktemp("bias")
    folder = make_checkpoint(tmp / "ckpt", arch="llama", attention_bias=True)
    export_onnx(load_wide_model(folder, dtype="bfloat16"), tmp / "bf16")
    export_onnx(load_wide_model(folder, dtype="float32"), tmp / "f32")
    return tmp / "bf16", tmp / "f32"


@pytest.mark.parametrize("which,flag,precision", [("bf16", "--bf16", "bfloat16"), ("f32", "--bf16", "bfloat16"),
                                                  ("f32", "--fp16", "float16"), ("f32", None, "float32")])
def test_attention_bias_checkpoint_builds_engines(bias_exports, tmp_path, which, flag, precision):
    folder = bias_exports[0] if which == "bf16" else bias_exports[1]
    result = _run_cli(["--onnx", str(folder), "--output", str(tmp_path / "out"), *([flag] if flag else []), *SMALL])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "wide_engine.json").read_text())
    assert manifest["precision"] == precision and manifest["strongly_typed"]
    dtypes = {t["name"]: t["dtype"] for t in manifest["engines"][0]["inputs"]}
    assert dtypes["past_key_values.1.value"] == precision
    assert {t["name"]: t["dtype"] for t in manifest["engines"][0]["outputs"]}["logits"] == "float32"
    assert manifest["wide_nodes"]["total"] == 12  # 2 layers x (2 routers, q, gate/up, o, down)
    if which == "f32" and flag:
        assert manifest["fp16_conversion"]["to"] == precision


def test_bf16_flag_errors_are_one_line(bias_exports, tmp_path):
    line = assert_one_line_error(_run_cli(["--onnx", str(bias_exports[0]), "--output", str(tmp_path / "a"),
                                           "--fp16", *SMALL]))
    assert "bfloat16" in line
    line = assert_one_line_error(_run_cli(["--onnx", str(bias_exports[1]), "--output", str(tmp_path / "b"),
                                           "--fp16", "--bf16", *SMALL]))
    assert "exclude" in line


def test_an_output_inside_the_onnx_folder_is_refused(demo_onnx, tmp_path):
    """The engines would land among the export's files (and `triton --onnx` would then copy them along)."""
    before = sorted(p.name for p in demo_onnx.iterdir())
    for inside in (demo_onnx / "engine", demo_onnx / "sub" / "engine"):
        result = _run_cli(["--onnx", str(demo_onnx), "--output", str(inside), "--force", *SMALL])
        line = assert_one_line_error(result)
        assert "is inside the ONNX folder" in line and "(hint: choose an --output outside it" in line
    assert sorted(p.name for p in demo_onnx.iterdir()) == before


def test_fp16_of_an_fp16_export_says_there_is_nothing_to_convert(tmp_path, monkeypatch, capsys):
    from wide_export.checkpoint import load_wide_model
    from wide_export.export.onnx_export import export_onnx
    from wide_export.trt import build_engines as build

    export_onnx(load_wide_model(None, dtype="float16"), tmp_path / "onnx")

    def stop(*_a, **_k):
        raise RuntimeError("stop before TensorRT")

    monkeypatch.setattr(build, "_build", stop)
    monkeypatch.setattr(build, "_fp16_graph", lambda *a: pytest.fail("an fp16 export must not be converted"))
    with pytest.raises(RuntimeError, match="stop before TensorRT"):
        build.build_engine_here(onnx_dir=str(tmp_path / "onnx"), output_dir=str(tmp_path / "out"), fp16=True)
    err = capsys.readouterr().err
    assert "note: --fp16:" in err and "is already float16, nothing to convert" in err


def test_an_interrupted_build_prints_our_line_only(demo_onnx, tmp_path):
    """Ctrl-C while TensorRT builds: no `[E] ... BuildCanceled` / `Invalid Engine` lines before ours."""
    import os
    import signal
    from pathlib import Path

    pytest.importorskip("tensorrt_rtx")

    def building() -> bool:  # the TensorRT-RTX child process has started
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and b"wide_export.trt._child" in (entry / "cmdline").read_bytes():
                    return True
            except OSError:
                pass
        return False

    code, err = signal_when_ready(
        [sys.executable, "-m", "wide_export", "trt", "--onnx", str(demo_onnx), "--output", str(tmp_path / "out"),
         "--max-batch", "4", "--max-input-len", "256", "--max-seq-len", "512"],
        lambda err: building() and "Building engine" in err,  # parsed: the build runs (its progress line)
        signal.SIGINT, env={**os.environ, "WIDE_TRT_PLUGIN_LIB": ""}, timeout=120, settle=0.3)  # inside the build
    assert code == 130, err
    assert "[E]" not in err and "BuildCanceled" not in err and "Invalid Engine" not in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGINT)"), err
    assert list(tmp_path.iterdir()) == []


def test_an_attention_op_export_builds_from_the_ops_function_body(tmp_path):
    """`onnx --attention-op` puts WideMaskedAttention nodes in the graph; without the plugin library (CI: no
    TensorRT headers) TensorRT builds them from their standard-op function body."""
    from wide_export.checkpoint import Sources
    from wide_export.pipelines.onnx import export_and_verify

    export_and_verify(Sources(None), tmp_path / "onnx", attention_op=True, verify=False)
    result = _run_cli(["--onnx", str(tmp_path / "onnx"), "--output", str(tmp_path / "out"), *SMALL])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "wide_engine.json").read_text())
    assert manifest["wide_nodes"]["by_op"]["WideMaskedAttention"] == {"plugin_layers": 0, "inlined": 3}


def test_an_attention_op_export_builds_its_attention_as_plugin_layers(plugin_lib, tmp_path):
    """With the plugin library every node of an `onnx --attention-op` export becomes a plugin layer, the two
    WideMaskedAttention nodes included (TensorRT-RTX checks the plugin's types, shapes and formats over both
    profiles; running it needs a GPU: tests/trt/test_gpu_engines.py). Head size 16: the plugin's cubins take
    multiples of 16 (the demo model's 8 is refused when the engine is built)."""
    from tests.helpers import make_checkpoint
    from wide_export.checkpoint import Sources
    from wide_export.pipelines.onnx import export_and_verify
    from wide_export.trt.build_engines import build_engine

    folder = make_checkpoint(tmp_path / "ckpt", hidden_size=128, num_heads=8, num_kv_heads=2)
    export_and_verify(Sources(folder), tmp_path / "onnx", attention_op=True, verify=False)
    manifest = build_engine(tmp_path / "onnx", tmp_path / "engine", plugins=plugin_lib, progress=False,
                            limits={"max_batch": 2, "max_input_len": 16, "max_seq_len": 32})
    report = manifest["wide_nodes"]
    assert report["by_op"]["WideMaskedAttention"] == {"plugin_layers": 2, "inlined": 0}
    assert (report["plugin_layers"], report["inlined"]) == (report["total"], 0)
