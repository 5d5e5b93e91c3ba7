"""A command given another kind of our folders says what it got and which
command or flag takes it (wide_export/base/folders.py). The folders are their writers' marker files only: the
commands must refuse them before reading anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error

LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 192,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2}


def _make(root: Path, kind: str) -> Path:
    folder = root / kind
    folder.mkdir()
    if kind == "sharded":
        (folder / "tp_manifest.json").write_text("{}")
    elif kind == "onnx":
        (folder / "model.onnx").write_bytes(b"")
        (folder / "wide_config.json").write_text("{}")
    elif kind == "engines":
        (folder / "wide_engine.json").write_text(json.dumps({"engines": []}))
    elif kind == "vllm":
        (folder / "config.json").write_text(json.dumps({**LLAMA, "architectures": ["WideLlamaForCausalLM"],
                                                         "wide": {"format": "wide-export/vllm", "version": 1}}))
    elif kind == "repository":
        (folder / "wide_llm").mkdir()
        (folder / "wide_llm" / "config.pbtxt").write_text('name: "wide_llm"\n')
    return folder


CASES = [  # (command line with {dir}, folder kind, what the hint must say)
    ("triton --onnx {dir} --output {out}", "sharded", "is a tensor-parallel ONNX export (wide-export onnx --tp): "
                                                      "run its ranks with `wide-export run-tp --onnx DIR`"),
    ("triton --onnx {dir} --output {out}", "engines", "is an engine folder (wide-export trt): pass it as --engines DIR"),
    ("triton --onnx {dir} --output {out}", "vllm", "is a vLLM folder (wide-export vllm): serve it with `vllm serve DIR`"),
    ("triton --onnx {dir} --output {out}", "repository", "is a Triton model repository (wide-export triton): serve "
                                                         "it with `wide-export serve --repository DIR`"),
    ("verify --onnx {dir}", "engines", "is an engine folder (wide-export trt): pass it as --engine DIR"),
    ("verify --onnx {dir}", "repository", "serve it with `wide-export serve --repository DIR`"),
    ("verify --engine {dir}", "onnx", "is an ONNX export (wide-export onnx): pass it as --onnx DIR"),
    ("verify --engine {dir}", "vllm", "is a vLLM folder"),
    ("triton --engines {dir} --output {out}", "onnx", "is an ONNX export (wide-export onnx): pass it as --onnx DIR"),
    ("triton --engines {dir} --output {out}", "sharded", "Triton and TensorRT take an export without --tp"),
    ("trt --onnx {dir} --output {out}", "engines", "is an engine folder (wide-export trt): it is built already; "
                                                   "serve it with `wide-export triton --engines DIR`"),
    ("trt --onnx {dir} --output {out}", "sharded", "is a tensor-parallel ONNX export"),
    ("onnx --model {dir} --output {out}", "onnx", "is an ONNX export (wide-export onnx): pass it as --onnx DIR "
                                                  "(wide-export trt, triton, verify)"),
    ("onnx --model {dir} --output {out}", "vllm", "is a vLLM folder (wide-export vllm): serve it with `vllm serve "
                                                  "DIR` (`wide-vllm serve DIR` with the CPU wheel, docs/vllm.md); "
                                                  "--model takes the Hugging Face folder"),
    ("vllm --model {dir} --output {out}", "repository", "is a Triton model repository"),
]


@pytest.mark.parametrize("line,kind,hint", CASES, ids=[f"{c[0].split()[0]}{c[0].split()[1]}-{c[1]}" for c in CASES])
def test_a_folder_of_another_kind_names_the_command_that_takes_it(tmp_path, line, kind, hint):
    from wide_export.cli import app

    folder = _make(tmp_path, kind)
    args = line.format(dir=folder, out=tmp_path / "out").split()
    error = assert_one_line_error(CliRunner().invoke(app, args))
    assert f"(hint: {folder} is " in error and hint in error, error
    assert not (tmp_path / "out").exists()


def test_kinds_are_told_apart():
    from wide_export.base.folders import kind_of

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for kind in ("sharded", "onnx", "engines", "vllm", "repository"):
            assert kind_of(_make(root, kind)) == kind
        (root / "empty").mkdir()
        assert kind_of(root / "empty") is None and kind_of(root / "missing") is None
        (root / "hf").mkdir()
        (root / "hf" / "config.json").write_text(json.dumps(LLAMA))
        assert kind_of(root / "hf") == "model"
