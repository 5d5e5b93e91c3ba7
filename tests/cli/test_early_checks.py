"""A wrong path is one error line at once: the CLI checks the paths the user gave (model folder, router and
LoRA files) while it parses its options (cli/common.py), and each command its other arguments, before a command
imports torch, transformers or onnx
(5-15 s on a loaded 2-core machine). Each case runs the real entry point in a fresh interpreter and asserts,
besides the one line and exit 2, that none of those modules was imported."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import assert_one_line_error

HEAVY = ("torch", "transformers", "onnx", "onnxruntime")

# The entry point as the console script runs it; then which heavy modules got imported, on stdout.
SCRIPT = """
import json, sys
from wide_export.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    code = done.code
print(json.dumps([m for m in %r if m in sys.modules]))
sys.exit(code)
""" % (HEAVY,)


def _run(args: list[str]) -> tuple[subprocess.CompletedProcess, list[str], float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    done.stdout = ""  # the module list is this test's, not the command's output
    return done, imported, took


def _cases(tmp):
    missing = tmp / "nonexistent"
    a_file = tmp / "weights.safetensors"
    a_file.write_bytes(b"x")
    empty = tmp / "empty"
    empty.mkdir()
    out = str(tmp / "out")
    return {
        "onnx --model missing": (["onnx", "--output", out, "--model", str(missing)], "model folder not found"),
        "onnx --model a file": (["onnx", "--output", out, "--model", str(a_file)], "is a file, not a folder"),
        "onnx --model without config.json": (["onnx", "--output", out, "--model", str(empty)], "has no config.json"),
        "onnx --router missing": (["onnx", "--output", out, "--router", str(missing)], "no router file"),
        "onnx --lora missing": (["onnx", "--output", out, "--lora", str(missing)], "LoRA file not found"),
        "generate": (["generate", "--model", str(missing), "--prompt", "hi"], "model folder not found"),
        "generate without a prompt": (["generate", "--max-new", "4"], "give the prompt as --prompt"),
        "gguf": (["gguf", "--out", str(tmp / "m.gguf"), "--model", str(missing)], "model folder not found"),
        "vllm": (["vllm", "--output", out, "--model", str(missing)], "model folder not found"),
        "serve --model": (["serve", "--model", str(missing), "--openai-port", "9"], "model folder not found"),
        "verify --model": (["verify", "--onnx", out, "--model", str(missing)], "model folder not found"),
        "bench generate": (["bench", "generate", "--model", str(missing)], "model folder not found"),
        "bench vllm": (["bench", "vllm", "--model", str(missing)], "model folder not found"),
        "analyze": (["analyze", "--model", str(missing), "--text", str(a_file)], "model folder not found"),
    }


CASES = [
    "onnx --model missing", "onnx --model a file", "onnx --model without config.json", "onnx --router missing",
    "onnx --lora missing", "generate", "generate without a prompt", "gguf", "vllm", "serve --model", "verify --model", "bench generate",
    "bench vllm", "analyze",
]


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_input_is_one_line_before_any_heavy_import(case, tmp_path):
    args, said = _cases(tmp_path)[case]
    done, imported, took = _run(args)
    line = assert_one_line_error(done)
    assert said in line, line
    assert imported == [], f"{case}: imported {imported} before refusing the input ({took:.1f} s)"
    assert not (tmp_path / "out").exists() and not (tmp_path / "m.gguf").exists()
    print(f"{case}: {took:.2f} s")  # the timing, for a report (-s); the import check is the test
