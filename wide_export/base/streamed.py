"""Text streamed to stdout as it comes (`wide-export generate`), and whether its last line is still open: a line
the CLI prints afterwards (the interrupt line, an error) starts on a line of its own instead of being glued to
the text (`...ne^Cinterrupted (SIGINT)`)."""

from __future__ import annotations

import sys

_OPEN = {"line": False}  # the last text written through write() did not end with a newline


def write(text: str) -> None:
    """Write `text` to stdout now (flushed), remembering whether it left a line open."""
    if text:
        sys.stdout.write(text)
        _OPEN["line"] = not text.endswith("\n")
    sys.stdout.flush()


def reset() -> None:
    """A new command: no line of an earlier one (same process: tests, notebooks) is open."""
    _OPEN["line"] = False


def end_line() -> None:
    """End the open line of streamed text, if any (a newline on stdout, where the text went)."""
    if _OPEN["line"]:
        _OPEN["line"] = False
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (OSError, ValueError):  # stdout closed or gone (a pipe's reader quit): nothing to end
            pass
