"""Options that mean the same across commands: `triton --force` (as `onnx`/`trt`), a `--model`
that is a file."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


def _app():
    from wide_export.cli import app

    return app


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "(hint: " in lines[0], result.output
    return lines[0]


def test_triton_force_replaces_an_existing_repository(demo_onnx, tmp_path):
    runner = CliRunner()
    out = tmp_path / "repo"
    args = ["triton", "--onnx", str(demo_onnx), "--output", str(out), "--max-batch", "2"]
    assert runner.invoke(_app(), args).exit_code == 0
    (out / "stale.txt").write_text("from an earlier run")
    line = _one_error_line(runner.invoke(_app(), args))  # without --force: refused, untouched
    assert "exists and is not empty" in line and "pass --force to replace it" in line
    assert (out / "stale.txt").exists()
    forced = runner.invoke(_app(), [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert not (out / "stale.txt").exists() and (out / "wide_llm" / "config.pbtxt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]  # no temp folder left beside it


def test_triton_force_never_replaces_its_input(demo_onnx, tmp_path):
    import shutil

    onnx_dir = tmp_path / "onnx"
    shutil.copytree(demo_onnx, onnx_dir)
    before = sorted(p.name for p in onnx_dir.iterdir())
    line = _one_error_line(CliRunner().invoke(_app(), ["triton", "--onnx", str(onnx_dir), "--output", str(onnx_dir),
                                                       "--force"]))
    assert "would replace your input" in line
    assert sorted(p.name for p in onnx_dir.iterdir()) == before


@pytest.mark.parametrize("force", [False, True])
def test_triton_output_inside_its_input_is_refused(demo_onnx, tmp_path, force):
    """A repository written into the export it reads: refused like the reverse, nothing written."""
    import shutil

    onnx_dir = tmp_path / "onnx"
    shutil.copytree(demo_onnx, onnx_dir)
    before = sorted(str(p.relative_to(onnx_dir)) for p in onnx_dir.rglob("*"))
    for inside in (onnx_dir / "repo", onnx_dir / "a" / "b"):
        line = _one_error_line(CliRunner().invoke(_app(), ["triton", "--onnx", str(onnx_dir), "--output", str(inside)]
                                                  + (["--force"] if force else [])))
        assert f"is inside your input {onnx_dir}" in line and "choose an --output outside" in line
    assert sorted(str(p.relative_to(onnx_dir)) for p in onnx_dir.rglob("*")) == before


@pytest.mark.parametrize("command", ["onnx", "verify"])
def test_model_path_that_is_a_file_says_so(command, demo_onnx, tmp_path):
    given = tmp_path / "config.json"
    given.write_text("{}")
    args = (["onnx", "--output", str(tmp_path / "out")] if command == "onnx"
            else ["verify", "--onnx", str(demo_onnx), "--report", str(tmp_path / "r.json")])
    line = _one_error_line(CliRunner().invoke(_app(), [*args, "--model", str(given)]))
    assert f"--model {given} is a file, not a folder" in line and f"--model {tmp_path}" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
