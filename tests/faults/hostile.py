"""Shared pieces of the hostile-folder tests: a secret file outside every folder the command
is given, and the checks that it never reaches an output and that a refusal leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import assert_one_line_error
from wide_export.cli import get_app

SECRET = b"root:$6$not-for-export$0123456789:19000:0:99999:7:::\n"


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside every folder the command is given."""
    path = tmp_path / "elsewhere" / "shadow"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def no_secret_in(folder: Path) -> None:
    for path in folder.rglob("*") if folder.exists() else ():
        if path.is_file():
            assert SECRET not in path.read_bytes(), path


def refused(result, out: Path, *expect: str) -> str:
    """One line `error: ... (hint: ...)`, exit 2, holding each of `expect`; no `out`, no staging folder."""
    line = assert_one_line_error(result)
    for piece in expect:
        assert piece in line, line
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return line
