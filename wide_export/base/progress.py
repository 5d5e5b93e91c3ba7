"""Progress for long work: named stages with a spinner and their durations (rich)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Iterator


class Stages:
    """`with stages.stage("trace"):` shows a spinner, then `✓ trace  3.2 s`; quiet=True prints nothing."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.times: dict[str, float] = {}
        self._status = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator["Stages"]:
        start = time.perf_counter()
        if self.quiet:
            yield self
        else:
            with self.console.status(f"{name} ...") as status:
                self._status = status
                try:
                    yield self
                finally:
                    self._status = None
        self.times[name] = time.perf_counter() - start
        if not self.quiet:
            self.console.print(f"[green]✓[/] {name:<10} {self.times[name]:6.1f} s")

    def update(self, message: str) -> None:
        """Detail line under the current stage's spinner."""
        if self._status is not None:
            self._status.update(message)

    def note(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message)


class Steps:
    """Progress of long work in named stages, some counted: `update("aot", 12, 272)`.

    On a terminal: one rich line with a spinner, the stage, a bar and the count when there is one, and the
    elapsed time; it disappears when the work ends. Piped (a log, CI): one line per stage that runs longer
    than $WIDE_PROGRESS_DELAY seconds (default 2; 0 prints every stage at once), then its newest count at
    most every `every` seconds, so a log shows where a long run is without a line per step.
    """

    def __init__(self, title: str, console=None, every: float = 30.0):
        from rich.console import Console

        self.console = console or Console(stderr=True, highlight=False)
        self.title = title
        self.every = every
        self._stage: str | None = None
        self._last_print = 0.0
        self._bars = None
        self._task = None
        # Piped, a stage's line appears once it has run `delay` seconds: quick stages (and a bad input found
        # in the first second, whose error must stay the only line) print nothing.
        self.delay = float(os.environ.get("WIDE_PROGRESS_DELAY", "2"))
        self._pending: tuple[float, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Steps":
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
            from rich.progress import TimeElapsedColumn

            self._bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self._bars.__enter__()
            self._task = self._bars.add_task(self.title, total=None)
        elif self.delay > 0:
            self._thread = threading.Thread(target=self._flush_slow, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bars is not None:
            self._bars.__exit__(*exc)
            self._bars = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._pending = None

    def _flush_slow(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                if self._pending is not None and time.monotonic() - self._pending[0] >= self.delay:
                    self._print(self._pending[1])

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, soft_wrap=True)
        self._pending, self._last_print = None, time.monotonic()

    def _piped(self, head: str, line: str) -> None:
        """A new stage waits `delay` s before it is printed; a counted stage's update after `every` s prints."""
        with self._lock:
            now = time.monotonic()
            if head != self._stage:
                self._stage = head
                if self.delay <= 0:
                    self._print(line)
                else:
                    self._pending = (now, line)
            elif self._pending is not None:
                self._pending = (self._pending[0], line)  # the newest detail of a stage not printed yet
            elif now - self._last_print >= self.every:
                self._print(line)

    def say(self, message: str) -> None:
        """Free-text progress ("window 2/9 (512 tokens), WIDE, layer 3/32"): the whole message on a terminal;
        piped, a line when the part before the first comma changes, or after `every` seconds."""
        if self._bars is not None:
            self._bars.update(self._task, description=f"{self.title}: {message}")
            return
        self._piped(message.split(",")[0], f"{self.title}: {message}")

    def update(self, stage: str, completed: int | None = None, total: int | None = None) -> None:
        """Now in `stage`, `completed` of `total` steps done (both None: not counted)."""
        count = f" {completed}/{total}" if completed is not None and total else ""
        if self._bars is not None:
            self._bars.update(self._task, description=f"{self.title}: {stage}", completed=completed or 0,
                              total=total or None)
            return
        self._piped(stage, f"{self.title}: {stage}{count}")


def status(console, text: str):
    """`console.status(text)` on a terminal; piped, the text as one line (a log shows each stage starting)."""
    if console.is_terminal:
        return console.status(text)
    console.print(text, markup=False, soft_wrap=True)
    return contextlib.nullcontext()
