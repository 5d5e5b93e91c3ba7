"""`wide-export vllm` of a float32 folder says how to serve it in float32: vLLM's `--dtype auto` casts a float32
model to bfloat16 or float16 without a word (tests/vllm/test_compat.py checks that against vLLM itself, and
that `wide-vllm serve` keeps float32 by default)."""

from __future__ import annotations

from typer.testing import CliRunner

from wide_export.cli import get_app
from wide_export.vllm.compat import folder_dtype


def test_the_export_of_a_float32_folder_says_how_vllm_keeps_float32(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(get_app(), ["vllm", "--output", str(out)])  # the demo model: float32
    assert result.exit_code == 0, result.output
    assert folder_dtype(out) == "float32"  # what vLLM's auto reads from the folder
    text = " ".join(result.output.split())  # rich wraps long lines
    assert f"vllm serve {out} --dtype float32" in text, text
    assert "casts this float32 folder to bfloat16 or float16" in text and "wide-vllm serve keeps float32" in text
