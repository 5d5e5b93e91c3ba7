"""Source checksums computed while the export traces, not before it.

Hashing a 16 GB checkpoint takes tens of seconds on one core; the trace is
Python-bound on another. hashlib and file reads release the GIL, so a
background thread fills in the sha256 of every source the loader described
without one (load_wide_model(checksums=False)), and the export waits for it only
when it writes wide_config.json.
"""

from __future__ import annotations

import threading
from pathlib import Path

from wide_export.base.checksum import sha256_of


class Hashing:
    """A daemon thread hashing files (Ctrl-C never waits for it); result() joins and re-raises."""

    def __init__(self, todo: list[dict]):
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(todo,), name="wide-sha256", daemon=True)
        self._thread.start()

    def _work(self, todo: list[dict]) -> None:
        try:
            for info in todo:
                info["sha256"] = sha256_of(info["path"])
        except BaseException as err:  # re-raised in the exporting thread
            self._error = err

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def hash_in_background(sources: dict) -> Hashing | None:
    """Start filling in the missing `sha256` of `sources` (role -> {path, bytes, ...}); None if none is missing."""
    todo = [info for info in sources.values() if "sha256" not in info and Path(info.get("path", "")).is_file()]
    return Hashing(todo) if todo else None
