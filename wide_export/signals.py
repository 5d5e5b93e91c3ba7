"""SIGTERM handled like Ctrl-C, so `kill` of a command cleans up as Ctrl-C does.

Python's default SIGTERM ends the process without running `finally` blocks: a
child process or server it started would keep running and a temp folder stay.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator


_INTERRUPTED = threading.Event()


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
    finally:
        sys.unraisablehook = report_unraisable
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # The interrupt belonged to this command (it propagated, or the publish step refused): a later
        # command or API call in the same process (tests, notebooks) must not see it.
        _INTERRUPTED.clear()
