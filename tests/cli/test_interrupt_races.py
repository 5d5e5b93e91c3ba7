"""Interrupts at the awkward moments (security issue, item 8): during the publish step's two renames,
after an output was published, wrapped into another exception by a library, and while the command
modules are still importing. Never a traceback, never "nothing was written" over a replaced OUT,
never a half-published OUT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import typer

from wide_export.base import outdir
from wide_export.cli.common import user_errors
from wide_export.base.signals import interrupt_on_signals
from tests.helpers import sigint_default


@pytest.fixture(autouse=True)
def sigint_raises():
    """These tests Ctrl-C this very process: SIGINT at Python's default (KeyboardInterrupt) for each of them. A
    test run started in the background of a script (`pytest &`, nohup) inherits SIGINT ignored, which
    interrupt_on_signals keeps ignored on purpose; that is not what these tests are about."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _run(fn) -> tuple[int, str]:
    """Run `fn` as a CLI command body (user_errors + interrupt_on_signals); (exit code, what it printed)."""
    @user_errors
    def command():
        with interrupt_on_signals():
            fn()

    try:
        command()
    except typer.Exit as done:
        return done.exit_code, ""
    return 0, ""


def test_sigint_between_the_two_renames_of_force_completes_the_publish_first(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    renames = []
    real = outdir.rename_noreplace

    def rename(src, dst):
        real(src, dst)
        renames.append((src, dst))
        if len(renames) == 1:  # OUT moved aside, the new one not in place yet: the worst moment
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # a signal not held back would be raised here

    monkeypatch.setattr(outdir, "rename_noreplace", rename)

    def work():
        with outdir.atomic_output_dir(out, force=True) as tmp:
            (tmp / "new.txt").write_text("new")

    code, _ = _run(work)
    err = capsys.readouterr().err
    assert len(renames) == 2
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]  # complete, the new one
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no old copy or temp folder left
    assert code == 0 and "written completely" in err and "nothing was written" not in err


def test_an_interrupt_after_publishing_reports_success_not_nothing_written(tmp_path, capsys):
    out = tmp_path / "out"

    def work():
        with outdir.atomic_output_dir(out) as tmp:
            (tmp / "a").write_text("a")
        raise KeyboardInterrupt  # Ctrl-C while printing the summary

    code, _ = _run(work)
    err = capsys.readouterr().err
    assert out.is_dir() and code == 0 and "written completely" in err


def test_an_interrupt_before_publishing_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"

    def work():
        with outdir.atomic_output_dir(out) as tmp:
            (tmp / "a").write_text("a")
            raise KeyboardInterrupt

    code, _ = _run(work)
    assert code == 130 and not out.exists() and "nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_a_library_turned_into_another_error_is_still_an_interrupt(capsys):
    def work():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            raise RuntimeError("torch.onnx: the exporter failed") from None  # what a tracer may do with it

    code, _ = _run(work)
    assert code == 130 and "interrupted" in capsys.readouterr().err


def test_ctrl_c_while_the_command_modules_import_is_one_line():
    script = (
        "import importlib, os, signal\n"
        "real = importlib.import_module\n"
        "def slow(name, *a):\n"
        "    if name.startswith('wide_export.cli.'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *a)\n"
        "importlib.import_module = slow\n"
        "from wide_export.cli import main\n"
        "main(['onnx', '--help'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=sigint_default)
    assert done.returncode == 130, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted (SIGINT)"), done.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_held_back_during_a_publish_are_delivered_after_it(sig):
    from wide_export.base.signals import signals_deferred

    seen = []
    with interrupt_on_signals():
        try:
            with signals_deferred():
                os.kill(os.getpid(), sig)
                time.sleep(0.2)
                seen.append("block finished")
            time.sleep(1)
        except KeyboardInterrupt:
            seen.append("interrupt")
    assert seen == ["block finished", "interrupt"]
