"""A rich progress display fed by TensorRT's IProgressMonitor (where the version has one)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from wide_export.base.signals import interrupted


@contextmanager
def progress_monitor(trt, enabled: bool = True) -> Iterator[Optional[object]]:
    """Yield an IProgressMonitor drawing one rich bar per build phase, or None if unavailable."""
    base = getattr(trt, "IProgressMonitor", None)
    if not enabled or base is None:
        yield None
        return
    import time

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, highlight=False)
    piped = not console.is_terminal  # a log or CI: no bars; one line per top-level phase instead
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=True, console=console, disable=piped) as bars:

        class _Monitor(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                base.__init__(self)
                self._tasks: dict[str, int] = {}

            def phase_start(self, phase_name, parent_phase, num_steps):
                indent = "  " if parent_phase else ""
                if piped and not parent_phase:
                    console.print(f"trt: {phase_name} ({num_steps} steps) at {time.monotonic() - started:.0f} s",
                                  markup=False)
                self._tasks[phase_name] = bars.add_task(f"{indent}{phase_name}", total=max(1, num_steps))

            def step_complete(self, phase_name, step):
                task = self._tasks.get(phase_name)
                if task is not None:
                    bars.update(task, completed=step + 1)
                if interrupted():  # cancel the build on Ctrl-C / SIGTERM
                    _silence_polygraphy()
                    return False
                return True

            def phase_finish(self, phase_name):
                task = self._tasks.pop(phase_name, None)
                if task is not None:
                    bars.remove_task(task)

        yield _Monitor()


def _silence_polygraphy() -> None:
    """A cancelled build makes Polygraphy log "[E] Invalid Engine ..." before it raises: our one line says it."""
    import sys

    logger_module = sys.modules.get("polygraphy.logger")
    if logger_module is not None:
        logger_module.G_LOGGER.module_severity = logger_module.G_LOGGER.CRITICAL + 1
