"""Progress for long work: named stages with a spinner and their durations (rich)."""

from __future__ import annotations

import contextlib
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
