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
_STATE = {"depth": 0, "signal": None}  # nesting of interrupt_on_signals; the last signal raise_interrupt saw

# Exit codes of an interrupted command, as a shell reports a process killed by the signal (128 + number).
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt that says what the interrupted work left behind (`left`: one clause), after
    its cleanup ran; the CLI prints `interrupted (SIGINT); <left>`."""

    def __init__(self, left: str):
        super().__init__(left)
        self.left = left


def raise_interrupt(signum, frame) -> None:
    """Signal handler: remember the interrupt and raise KeyboardInterrupt.

    Raised inside a callback from native code (a TensorRT logger or progress monitor) the
    exception is swallowed there, so long native calls also poll `interrupted()` afterwards.
    """
    _INTERRUPTED.set()
    _STATE["signal"] = signum
    raise KeyboardInterrupt


def last_signal() -> "signal.Signals | None":
    """The signal that interrupted the current (or last) command, None for a plain KeyboardInterrupt."""
    return _STATE["signal"]


def interrupt_exit_code() -> int:
    """130 after SIGINT (or a KeyboardInterrupt of unknown origin), 143 after SIGTERM."""
    return EXIT_CODES.get(_STATE["signal"], 130)


def interrupt_line(err: BaseException | None = None) -> str:
    """The one line an interrupted command prints: which signal, and what is left."""
    sig = _STATE["signal"]
    name = signal.Signals(sig).name if sig is not None else "SIGINT"
    left = getattr(err, "left", None) or "nothing was written"
    return f"interrupted ({name}); {left}"


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Work that must not be cut in half: within the block SIGINT/SIGTERM are recorded, not raised (a second
    Ctrl-C while child processes are being stopped and temp folders removed does not leave half of them);
    check_interrupted() after the block raises what was recorded. Only inside interrupt_on_signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def record(signum, frame) -> None:
        _INTERRUPTED.set()
        _STATE["signal"] = _STATE["signal"] or signum

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is raise_interrupt:  # only ours (inside interrupt_on_signals); others are left as they are
            signal.signal(sig, record)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    if threading.current_thread() is not threading.main_thread() or _STATE["depth"]:
        yield  # another thread, or nested in a block that already handles both signals
        return
    _INTERRUPTED.clear()  # a new command: interrupts of an earlier one (same process) do not count
    _STATE["signal"] = None  # last_signal() keeps this command's signal after the block, for its exit code
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, raise_interrupt)
    report_unraisable = sys.unraisablehook

    def unraisable(info) -> None:
        if not (isinstance(info.exc_value, KeyboardInterrupt) and _INTERRUPTED.is_set()):
            report_unraisable(info)

    sys.unraisablehook = unraisable
    _STATE["depth"] += 1
    try:
        yield
    except KeyboardInterrupt:
        raise
    except Exception:
        if _INTERRUPTED.is_set():  # the interrupt came back as another error (a library wrapped it)
            raise KeyboardInterrupt from None
        raise
    finally:
        _STATE["depth"] -= 1
        sys.unraisablehook = report_unraisable
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # The interrupt belonged to this command (it propagated, or the publish step refused): a later
        # command or API call in the same process (tests, notebooks) must not see it.
        _INTERRUPTED.clear()


def serve_until_signal(poll: float, check, stop) -> int:
    """Block until SIGINT / SIGTERM, calling check() every `poll` seconds (it raises to end serving), then
    stop() under the same handlers (a second Ctrl-C cannot cut the shutdown short) and give the old handlers
    back. Returns the signal's number (a server's exit code is 128 + it)."""
    done = threading.Event()
    got: list[int] = []

    def on_signal(signum, _frame) -> None:
        got.append(signum)
        done.set()

    handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not done.wait(poll):
            check()
    finally:
        try:
            stop()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return int(got[0])
