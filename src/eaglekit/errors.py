"""The one exception type users see: a message naming the problem and a hint naming the fix."""

from __future__ import annotations


class EaglekitError(Exception):
    """A user-facing error. `str(err)` is the message; `err.hint` says how to fix it.

    The CLI prints both and exits with status 2; library callers can catch it like any exception.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"
