"""SIGTERM handled like Ctrl-C, so `kill` of a command cleans up as Ctrl-C does.

Python's default SIGTERM ends the process without running `finally` blocks: a
child process or server it started would keep running and a temp folder stay.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator


_INTERRUPTED = threading.Event()
_PUBLISHED: list = []  # outputs this command published (outdir.atomic_output_dir)


def raise_interrupt(signum, frame) -> None:
    """Signal handler: remember the interrupt and raise KeyboardInterrupt.

    Raised inside a callback from native code (a TensorRT logger or progress monitor) the
    exception is swallowed there, so long native calls also poll `interrupted()` afterwards.
    """
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Has raise_interrupt run in this process?"""
    return _INTERRUPTED.is_set()


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if an interrupt was seen (and perhaps swallowed by native code)."""
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


def mark_published(output) -> None:
    """Record that `output` is complete and in place: a later interrupt cannot undo it."""
    _PUBLISHED.append(output)


def published() -> list:
    """The outputs this command published so far."""
    return list(_PUBLISHED)


def forget_published() -> None:
    """A new command starts: nothing published yet."""
    _PUBLISHED.clear()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT / SIGTERM held back until the block ends, then acted on as they would have been: a step
    that must not be cut in half (renaming a finished output into place) completes first.

    Done with Python handlers that only take note, not with the thread's signal mask: the kernel
    hands a process signal to any thread that does not block it (ONNX Runtime's and PyTorch's
    pools), and Python then runs the handler in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(pending[0], None)  # raise_interrupt, Python's default_int_handler: raises
            else:
                os.kill(os.getpid(), pending[0])  # SIG_DFL: what the signal would have done


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM run raise_interrupt (main thread only; elsewhere a
    no-op). A signal the process inherited as ignored (nohup, `&`) stays ignored.

    A KeyboardInterrupt raised inside a finalizer or weakref callback cannot propagate; Python
    would print it as "Exception ignored ... Traceback". It is already recorded (raise_interrupt set
    the flag that check_interrupted() and the publish step read), so within the block such reports
    are dropped; any other unraisable exception is reported as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _INTERRUPTED.clear()  # a new command: interrupts of an earlier one (same process) do not count
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, raise_interrupt)
    report_unraisable = sys.unraisablehook

    def unraisable(info) -> None:
        if not (isinstance(info.exc_value, KeyboardInterrupt) and _INTERRUPTED.is_set()):
            report_unraisable(info)

    sys.unraisablehook = unraisable
    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception:
        if _INTERRUPTED.is_set():  # the interrupt came back as another error (a library wrapped it)
            raise KeyboardInterrupt from None
        raise
    finally:
        sys.unraisablehook = report_unraisable
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # The interrupt belonged to this command (it propagated, or the publish step refused): a later
        # command or API call in the same process (tests, notebooks) must not see it.
        _INTERRUPTED.clear()
