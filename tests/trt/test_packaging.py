"""Recipes ship inside the package (a wheel has them: `--recipe NAME` works outside the checkout),
and `wide-export trt` prints the profile limits it used."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_ships_the_recipes(tmp_path):
    src = tmp_path / "src"  # build from a copy: never write build/ or egg-info into the shared checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "wide_export", src / "wide_export",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), "-q"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("wide_export-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "wide_export/recipes/llama-3.1-8b.json" in names and "wide_export/recipes/qwen3-8b.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what a non-editable install puts on sys.path
    code = ("import wide_export, wide_export.trt.recipes as r; print(wide_export.__file__); "
            "print(r.list_recipes()); print(r.load_recipe('llama-3.1-8b').name)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    where, names_line, loaded = run.stdout.splitlines()
    assert where.startswith(str(site))  # the wheel's copy, not the checkout
    assert "llama-3.1-8b" in names_line and loaded == "llama-3.1-8b"


@pytest.mark.trt
def test_trt_prints_the_profile_limits_it_used(demo_onnx, tmp_path):
    from wide_export.cli import app

    result = CliRunner().invoke(app, ["trt", "--onnx", str(demo_onnx), "--output", str(tmp_path / "e"),
                                      "--max-batch", "2", "--max-input-len", "16"],
                                env={"WIDE_TRT_PLUGIN_LIB": "", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    # the two flags given, ProfileLimits' documented default (256) for the third
    assert "limits: max-batch 2 (flag), max-input-len 16 (flag), max-seq-len 256 (default)" in out
    assert "profile 0 prefill: batch 1..2, tokens 1..16, past 0" in out
    assert "profile 1 decode: batch 1..2, 1 token, past 1..255" in out
