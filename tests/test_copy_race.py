"""Copies that cannot race. A thread swaps a folder's tokenizer file for a symlink to a
private file outside the folder, and back, as fast as it can; every copy either copies the folder's own file
or refuses in one line, and never the private file (the old check-then-copy-by-path copied it in 7 of 25
runs). Then the exporters' call sites: each copies through paths.copy_confined."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from wide_export.base.errors import WideError


def _swapper(name: Path, evil: Path, stop: threading.Event) -> None:
    """Swap `name` between its real file and a symlink to `evil`, atomically (rename over it), until stopped."""
    keep, tmp = name.with_name(".real"), name.with_name(".tmp")
    os.link(name, keep)
    while not stop.is_set():
        try:
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(evil)
            os.replace(tmp, name)  # the name is now a symlink to the private file
            os.link(keep, tmp)
            os.replace(tmp, name)  # and the real file again
        except OSError:
            pass


def test_a_swapped_name_never_copies_the_file_outside(tmp_path):
    from wide_export.base.paths import copy_confined

    folder = tmp_path / "model"
    folder.mkdir()
    real = folder / "tokenizer.json"
    real.write_text('{"real": true}')
    evil = tmp_path / "private.json"
    evil.write_text("SECRET")
    evil.chmod(0o600)
    stop = threading.Event()
    thread = threading.Thread(target=_swapper, args=(real, evil, stop), daemon=True)
    thread.start()
    import time

    copied = refused = i = 0
    deadline = time.monotonic() + 60
    try:  # at least 300 copies, and on until both sides of the race were seen (a loaded machine swaps slower)
        while i < 300 or not (copied and refused) and time.monotonic() < deadline:
            i += 1
            dst = tmp_path / f"out-{i}.json"
            try:
                copy_confined(real, dst, folder, "tokenizer file")
            except WideError as err:
                refused += 1
                assert "SECRET" not in str(err)  # a one-line refusal (which check saw the swap varies)
                assert not dst.exists()
                continue
            assert dst.read_text() == '{"real": true}', f"run {i} copied the private file"
            copied += 1
    finally:
        stop.set()
        thread.join(5)
    assert copied > 0 and refused > 0, (copied, refused)  # both sides of the race were seen


def test_mode_and_kind_of_the_source_are_kept_or_refused(tmp_path):
    from wide_export.base.paths import copy_confined

    folder = tmp_path / "m"
    folder.mkdir()
    private = folder / "tokenizer.json"
    private.write_text("{}")
    private.chmod(0o600)
    copy_confined(private, tmp_path / "a.json", folder, "tokenizer file")
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o600  # not widened to 0644
    os.mkfifo(folder / "fifo.json")
    with pytest.raises(WideError, match="is not a regular file"):
        copy_confined(folder / "fifo.json", tmp_path / "b.json", folder, "tokenizer file")
    (folder / "out.json").symlink_to(tmp_path / "a.json")
    with pytest.raises(WideError, match="outside"):
        copy_confined(folder / "out.json", tmp_path / "c.json", folder, "tokenizer file")
    with pytest.raises(WideError):  # an existing destination is never overwritten (O_EXCL)
        copy_confined(private, tmp_path / "a.json", folder, "tokenizer file")


def test_every_exporter_copies_through_copy_confined(tmp_path, monkeypatch):
    """onnx (genai files), vllm, triton and trt each copy the user's tokenizer files through copy_confined."""
    import wide_export.base.paths as paths
    from tests.helpers import make_checkpoint
    from wide_export.model.demo_tokenizer import write_demo_tokenizer

    calls = []
    real = paths.copy_confined

    def spy(src, dst, folder, what):
        calls.append(Path(src).name)
        return real(src, dst, folder, what)

    monkeypatch.setattr(paths, "copy_confined", spy)
    ckpt = make_checkpoint(tmp_path / "ckpt", num_heads=4, num_kv_heads=2, head_dim=32, hidden_size=128,
                           attn_groups=2, ffn_groups=12)
    write_demo_tokenizer(ckpt)
    from typer.testing import CliRunner

    from wide_export.cli import app

    for args in (["vllm", "--model", str(ckpt), "--output", str(tmp_path / "v")],
                 ["onnx", "--model", str(ckpt), "--output", str(tmp_path / "o"), "--no-verify"],
                 ["triton", "--onnx", str(tmp_path / "o"), "--output", str(tmp_path / "r")]):
        calls.clear()
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "tokenizer.json" in calls, (args[0], calls)
