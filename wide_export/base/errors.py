"""The one exception type for user errors.

The CLI prints a WideError as one line (message + hint) and exits with code 2;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class WideError(Exception):
    """A problem with the user's input or environment, with a hint to fix it."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message
