"""Publishing outputs: a folder that appeared while a run was writing is never replaced without
--force (two runs to one --output: exactly one wins, the other exits 2 with one line); a full
disk during `onnx` is one line and leaves no temp folder; --force over an output that cannot be
removed is one line and leaves the old output and no `.OUT.old-*` / `.OUT.tmp-*` behind."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error
from wide_export.cli import get_app
from wide_export.base.errors import WideError

CLI = [sys.executable, "-c", "from wide_export.cli import main; main()"]


def _one_error_line(result) -> str:
    """Exit 2, no traceback, exactly one `error: ... (hint: ...)` line (progress lines may precede it)."""
    code = result.returncode if hasattr(result, "returncode") else result.exit_code
    text = result.stdout + result.stderr if hasattr(result, "returncode") else result.output
    assert code == 2 and "Traceback" not in text, (code, text)
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "(hint: " in errors[0], text
    assert text.rstrip().endswith(errors[0]), text  # the last thing printed
    return errors[0]


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_two_writers_of_one_output_exactly_one_publishes(tmp_path):
    from wide_export.base.outdir import atomic_output_dir

    out = tmp_path / "out"
    both_written = threading.Barrier(2, timeout=30)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            with atomic_output_dir(out) as tmp:
                (tmp / "who.txt").write_text(str(i))
                both_written.wait()  # both passed the up-front check and wrote; now both publish
            results[i] = "ok"
        except WideError as err:
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [i for i, r in results.items() if r == "ok"]
    losers = [r for r in results.values() if isinstance(r, WideError)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert "appeared while this run was writing it" in str(losers[0]) and "--force" in str(losers[0])
    assert _tree(out) == {"who.txt": str(winners[0]).encode()}
    assert _leftovers(out) == []


def test_an_output_appearing_mid_export_is_kept_and_the_export_exits_2(tmp_path, monkeypatch):
    from wide_export.export import onnx_export

    out = tmp_path / "out"
    real = onnx_export.write_genai_files

    def someone_else_publishes(*args, **kwargs):
        out.mkdir()
        (out / "theirs.txt").write_text("another run")
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_export, "write_genai_files", someone_else_publishes)
    result = CliRunner().invoke(get_app(), ["onnx", "-o", str(out), "--no-verify"])
    line = _one_error_line(result)
    assert "appeared while this run was writing it" in line, line
    assert _tree(out) == {"theirs.txt": b"another run"}
    assert _leftovers(out) == []


def test_concurrent_triton_commands_to_one_output(tmp_path):
    from tests.triton import tiny_llm

    onnx = tmp_path / "onnx"
    onnx.mkdir()
    tiny_llm.write_tiny_model(onnx, 0)
    out = tmp_path / "repo"
    procs = [subprocess.Popen(CLI + ["triton", "--onnx", str(onnx), "--output", str(out)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    done = [(p, *p.communicate(timeout=120)) for p in procs]
    ok = [d for d in done if d[0].returncode == 0]
    failed = [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, o, e in done if p.returncode != 0]
    assert len(ok) == 1 and len(failed) == 1, [(p.returncode, e) for p, o, e in done]
    assert_one_line_error(failed[0])
    assert (out / "wide_llm" / "1" / "model.onnx").read_bytes() == (onnx / "model.onnx").read_bytes()
    assert _leftovers(out) == []


def test_disk_full_during_onnx_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    limit = 256 * 1024  # bytes per file: the export's model.onnx (with weights) is larger

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run(CLI + ["onnx", "-o", str(out), "--no-verify"], preexec_fn=small_files,
                            capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, COLUMNS="400"))
    line = _one_error_line(result)
    assert "disk full while writing" in line and str(out) in line, line
    assert not out.exists() and _leftovers(out) == []


def test_disk_full_during_triton_is_one_line_and_leaves_nothing(tmp_path):
    from tests.triton import tiny_llm

    onnx = tmp_path / "onnx"
    onnx.mkdir()
    tiny_llm.write_tiny_model(onnx, 0)
    out = tmp_path / "repo"
    limit = 4096  # bytes per file: the generation model's model.py is larger

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = subprocess.run(CLI + ["triton", "--onnx", str(onnx), "--output", str(out)], preexec_fn=small_files,
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="400"))
    line = _one_error_line(result)
    assert "disk full while writing" in line, line
    assert not out.exists() and _leftovers(out) == []


def _immutable(path: Path) -> None:
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (needs root and a file system with inode flags)")


def test_force_over_an_output_that_cannot_be_removed(tmp_path):
    from tests.triton import tiny_llm

    onnx = tmp_path / "onnx"
    onnx.mkdir()
    tiny_llm.write_tiny_model(onnx, 0)
    out = tmp_path / "repo"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "stuck.txt").write_text("old")
    (out / "a.txt").write_text("old too")
    before = _tree(out)
    _immutable(out / "sub" / "stuck.txt")
    try:
        result = CliRunner().invoke(get_app(), ["triton", "--onnx", str(onnx), "--output", str(out), "--force"])
        line = assert_one_line_error(result)
        assert "cannot be removed" in line and "stuck.txt" in line, line
        assert _tree(out) == before and _leftovers(out) == []
    finally:
        subprocess.run(["chattr", "-R", "-i", str(tmp_path)], check=False, capture_output=True)


def test_force_when_the_old_output_cannot_be_moved_at_publish(tmp_path, monkeypatch):
    """The output turns unremovable after the up-front check: still one line, old output kept."""
    from wide_export.base import outdir

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    real = outdir.rename_noreplace

    def refuse_moving_out(src, dst):
        if Path(src) == out:
            raise PermissionError(1, "Operation not permitted", str(src))
        return real(src, dst)

    monkeypatch.setattr(outdir, "rename_noreplace", refuse_moving_out)
    with pytest.raises(WideError, match="--force cannot replace") as err:
        with outdir.atomic_output_dir(out, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert "\n" not in str(err.value)
    assert _tree(out) == {"old.txt": b"old"} and _leftovers(out) == []


@pytest.mark.slow
def test_two_concurrent_onnx_exports_to_one_output(tmp_path):
    """The real race: both runs pass the up-front check, the later publisher must not replace."""
    out = tmp_path / "out"
    procs = [subprocess.Popen(CLI + ["onnx", "-o", str(out), "--no-verify"], text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="400")) for _ in range(2)]
    done = [(p, *p.communicate(timeout=900)) for p in procs]
    results = [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, o, e in done]
    assert sorted(r.returncode for r in results) == [0, 2], [(r.returncode, r.stderr[-500:]) for r in results]
    line = _one_error_line(next(r for r in results if r.returncode == 2))
    assert "appeared while this run was writing it" in line or "already exists" in line, line
    assert (out / "model.onnx").is_file() and _leftovers(out) == []
