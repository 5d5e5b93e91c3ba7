"""An interrupt swallowed late never publishes an interrupted run.

Ctrl-C / SIGTERM run signals.raise_interrupt, which records the interrupt and raises KeyboardInterrupt.
Raised inside a finalizer (or a callback from native code) that exception cannot propagate: the work
block then ends as if nothing happened. atomic_output_dir must still refuse to publish: the output is
not created (or, with --force, the old one is kept as it was), the temp folder is removed, and the
KeyboardInterrupt comes out. Shown failing with the `check_interrupted()` before `_publish` removed.
"""

from __future__ import annotations

import gc
import signal

import pytest

from wide_export.base.outdir import atomic_output_dir
from wide_export.base.signals import interrupt_on_signals, interrupted, raise_interrupt


class _InterruptedInFinalizer:
    """Stands for an object whose finalizer was running when SIGINT arrived."""

    def __del__(self):
        raise_interrupt(signal.SIGINT, None)


def _swallowed_interrupt() -> None:
    _InterruptedInFinalizer()
    gc.collect()  # the KeyboardInterrupt raised in __del__ goes to sys.unraisablehook, not to us
    assert interrupted()


def _leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_swallowed_interrupt_does_not_publish_a_new_output(tmp_path):
    out = tmp_path / "export"
    with interrupt_on_signals():
        with pytest.raises(KeyboardInterrupt):
            with atomic_output_dir(out) as work:
                (work / "model.onnx").write_bytes(b"half")
                _swallowed_interrupt()  # ... and the block goes on to its end normally
    assert not out.exists()
    assert _leftovers(tmp_path) == []  # no temp folder left either
    assert not interrupted()  # cleared for the next command of this process


def test_a_swallowed_interrupt_keeps_the_old_output_under_force(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"old, complete")
    with interrupt_on_signals():
        with pytest.raises(KeyboardInterrupt):
            with atomic_output_dir(out, force=True) as work:
                (work / "model.onnx").write_bytes(b"new, interrupted")
                _swallowed_interrupt()
    assert (out / "model.onnx").read_bytes() == b"old, complete"
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]
    assert _leftovers(tmp_path) == []


def test_after_an_interrupted_command_the_next_one_publishes(tmp_path):
    """The flag belongs to the command that saw it: a later run in the same process publishes."""
    with interrupt_on_signals():
        with pytest.raises(KeyboardInterrupt):
            with atomic_output_dir(tmp_path / "first") as work:
                _swallowed_interrupt()
    with interrupt_on_signals():
        with atomic_output_dir(tmp_path / "second") as work:
            (work / "f").write_text("done")
    assert (tmp_path / "second" / "f").read_text() == "done" and not (tmp_path / "first").exists()
