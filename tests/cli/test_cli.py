"""The real `wide-export` command end to end (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import onnx

from tests.helpers import assert_one_line_error, make_checkpoint

CLI = [sys.executable, "-m", "wide_export"]


def run(*args, check=True):
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_help_is_instant_and_imports_no_torch():
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "wide_export", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "onnx" in proc.stdout and "verify" in proc.stdout
    heavy = {"torch", "onnx", "onnxruntime", "transformers", "polygraphy", "tensorrt", "tritonclient"}
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not heavy & imported, heavy & imported
    assert time.perf_counter() - start < 20


def test_every_subcommand_help_works():
    for cmd in (["onnx"], ["verify"], ["bench", "export"]):
        proc = run(*cmd, "--help")
        assert "Usage" in proc.stdout


def test_serve_help_lists_the_openai_options():
    out = run("serve", "--help").stdout
    for option in ("--repository", "--openai-port", "--openai-address", "--served-model-name"):
        assert option in out, option


def test_demo_export_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = run("onnx", "--output", str(out))
    assert "embedded demo model" in proc.stderr
    assert "PASSED" in proc.stderr
    # piped, only our stage lines: not the exporter's registry warnings nor torch's pytree FutureWarning
    for noise in ("torchvision is not installed", "FutureWarning", "LeafSpec"):
        assert noise not in proc.stderr, proc.stderr
    assert {p.name for p in out.iterdir()} == {"model.onnx", "wide_config.json", "genai_config.json",
                                            "verify_report.json", "tokenizer.json", "tokenizer_config.json",
                                            "chat_template.jinja"}  # the demo's byte-level tokenizer
    report = json.loads((out / "verify_report.json").read_text())
    assert report["passed"] and report["decisions"]
    onnx.checker.check_model(str(out / "model.onnx"), full_check=True)
    # a second run is refused, --force replaces
    assert "already exists" in assert_one_line_error(run("onnx", "--output", str(out), "--no-verify", check=False))
    run("onnx", "--output", str(out), "--no-verify", "--force")
    assert not (out / "verify_report.json").exists()


def test_checkpoint_export_then_verify_alone(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", arch="qwen3", head_dim=16, lora=True)
    out = tmp_path / "onnx"
    run("onnx", "--model", str(ckpt), "--lora", str(ckpt / "lora.pth"), "--output", str(out), "--no-verify")
    report = tmp_path / "report.json"
    proc = run("verify", "--onnx", str(out), "--report", str(report), "--steps", "4")
    assert "PASSED" in proc.stderr
    data = json.loads(report.read_text())
    assert data["passed"] and data["settings"]["steps"] == 4
    assert len(data["decisions"]) == 2 * 2  # 2 layers x (attention + ffn)


def test_verify_fails_against_another_model(tmp_path):
    out = tmp_path / "onnx"
    run("onnx", "--output", str(out), "--no-verify")
    other = make_checkpoint(tmp_path / "other", arch="llama", num_layers=3, seed=5)
    proc = run("verify", "--onnx", str(out), "--model", str(other), "--report", str(tmp_path / "r.json"),
               check=False)
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False
