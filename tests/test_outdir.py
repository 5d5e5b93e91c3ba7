"""outdir.rename_noreplace, the step that publishes an output (mutation testing): atomic on
Linux through renameat2(RENAME_NOREPLACE) (never a plain rename, which would replace an empty folder
that another run created meanwhile), and the portable fallback where libc has no renameat2. The
error a caller sees names the target, as FileExistsError(EEXIST)."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from wide_export.base.outdir import rename_noreplace


def _no_plain_rename(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("os.rename used where renameat2 is available")

    monkeypatch.setattr(os, "rename", refuse)


def _assert_exists_error(err, dst):
    assert isinstance(err, FileExistsError)
    assert (err.errno, err.strerror, err.filename) == (errno.EEXIST, os.strerror(errno.EEXIST), str(dst))


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_renameat2_moves_a_folder_without_a_plain_rename(tmp_path, monkeypatch, relative):
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the working folder (AT_FDCWD)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("x")
    _no_plain_rename(monkeypatch)
    src, dst = ("src", "dst") if relative else (tmp_path / "src", tmp_path / "dst")
    rename_noreplace(src, dst)
    assert (tmp_path / "dst" / "f").read_text() == "x" and not (tmp_path / "src").exists()


@pytest.mark.parametrize("existing", ["empty folder", "file"])
def test_renameat2_never_replaces_an_existing_target(tmp_path, monkeypatch, existing):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    dst = tmp_path / "dst"
    dst.mkdir() if existing == "empty folder" else dst.write_text("theirs")
    _no_plain_rename(monkeypatch)
    with pytest.raises(FileExistsError) as err:
        rename_noreplace(tmp_path / "src", dst)
    _assert_exists_error(err.value, dst)
    assert (tmp_path / "src").is_dir() and dst.exists()


def test_without_renameat2_the_fallback_refuses_an_existing_target(tmp_path, monkeypatch):
    def no_libc(*args, **kwargs):
        raise OSError("no libc here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    (tmp_path / "src").mkdir()
    for name in ("file", "link"):
        dst = tmp_path / name
        dst.write_text("theirs") if name == "file" else dst.symlink_to(tmp_path / "nowhere")
        with pytest.raises(FileExistsError) as err:
            rename_noreplace(tmp_path / "src", dst)
        _assert_exists_error(err.value, dst)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("theirs")
    real_lexists = os.path.lexists
    # the folder appears between the check and the rename: the rename's ENOTEMPTY is reported as EEXIST
    monkeypatch.setattr(os.path, "lexists", lambda p: False if str(p) == str(full) else real_lexists(p))
    with pytest.raises(FileExistsError) as err:
        rename_noreplace(tmp_path / "src", full)
    assert err.value.errno == errno.EEXIST and (full / "x").read_text() == "theirs"
    rename_noreplace(tmp_path / "src", tmp_path / "new")
    assert (tmp_path / "new").is_dir() and not (tmp_path / "src").exists()


def test_disk_full_is_found_in_the_error_or_its_causes():
    """What atomic_output_dir turns into 'disk full' (one line, nothing written): an OSError with a
    disk-full errno, or a library's error that says so, itself or up to 10 causes down; nothing else."""
    from wide_export.base.outdir import _disk_full

    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        err = OSError(code, os.strerror(code))
        assert _disk_full(err) is err
    assert _disk_full(OSError(errno.EACCES, "denied")) is None and _disk_full(ValueError("x")) is None
    said = _disk_full(RuntimeError("protobuf: write failed\nNo space left on device"))
    assert said.errno == errno.ENOSPC and said.strerror == "No space left on device"
    for text in ("File too large", "Disk quota exceeded"):
        assert _disk_full(RuntimeError(text)).strerror == text

    def chain(depth, cause_attr="__cause__"):
        top = inner = OSError(errno.ENOSPC, "full")
        for i in range(depth):
            outer = RuntimeError(f"wrapped {i}")
            setattr(outer, cause_attr, inner)
            inner = outer
        return inner, top

    err, full = chain(9)
    assert _disk_full(err) is full  # 9 wrappers deep: found
    err, full = chain(3, "__context__")
    assert _disk_full(err) is full  # raised while handling it
    err, _ = chain(10)
    assert _disk_full(err) is None  # deeper than 10: not searched
