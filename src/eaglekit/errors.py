"""The one exception type users see: a message naming the problem and a hint naming the fix."""

from __future__ import annotations

import errno
import os
import re


class EaglekitError(Exception):
    """A user-facing error. `str(err)` is the message; `err.hint` says how to fix it.

    The CLI prints both and exits with `exit_code`: 2 (bad input: a path, a value, a file the user
    gave) unless the error says otherwise; library callers can catch it like any exception.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class RunFailed(EaglekitError):
    """A run that started on good input and failed on the way (a disk filled up, the loss became
    NaN): the CLI exits with status 1."""

    exit_code = 1


class DiskFull(RunFailed):
    """The disk filled up while writing (ENOSPC, EDQUOT)."""


def from_os_error(err: BaseException) -> EaglekitError | None:
    """The sentence and fix for an operating-system error (an `OSError`, or safetensors' error that
    wraps one: "... (os error 28)"), or None if `err` is neither. Disk full is a failed run (exit 1);
    a path the user gave that cannot be read or written is bad input (exit 2)."""
    path = err.filename if isinstance(err, OSError) else None  # safetensors' error names no path
    if isinstance(err, OSError):
        code, file = err.errno, err.filename
        if err.filename2:
            file = f"{err.filename} -> {err.filename2}"
    else:
        found = re.search(r"\(os error (\d+)\)", str(err)) if type(err).__name__ == "SafetensorError" else None
        if found is None:
            return None
        code, file = int(found.group(1)), None
    where = f" {file}" if file else ""
    reason = os.strerror(code) if code else str(err)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(
            f"the disk is full: writing{where or ' the output'} failed ({reason})",
            hint="free space on that disk, or pass an --out on another one, then run the command again "
            "(generate and features resume where they stopped; train with --resume)",
        )
    if code in (errno.EACCES, errno.EPERM):
        return EaglekitError(
            f"permission denied:{where or ' a file or folder this command uses'}",
            hint="make it readable (and an output folder writable) for this user, or pass another path",
        )
    if code == errno.EROFS:
        return EaglekitError(
            f"{file or 'the output'} is on a read-only file system", hint="pass an --out on a writable disk"
        )
    if code == errno.ELOOP:
        return EaglekitError(
            f"{file or 'a path'} is a symlink loop (a link that leads back to itself)",
            hint="fix or remove the link, or pass another path",
        )
    if code == errno.EEXIST:
        if path and os.path.isdir(path):
            return EaglekitError(f"{file} already exists", hint="pass another path, or move that folder away")
        return EaglekitError(
            f"{file or 'a path'} exists and is not a folder",
            hint="pass a folder path (a new one is created), or move that file away",
        )
    if code == errno.ENOTDIR:
        return EaglekitError(
            f"a part of{where or ' a path'} is a file, not a folder", hint="pass a path whose parents are folders"
        )
    if code == errno.EISDIR:
        return EaglekitError(f"{file or 'a path'} is a folder, a file was expected", hint="pass the file's path")
    if code == errno.ENOENT:
        return EaglekitError(f"no such file or folder:{where or ' (a path this command uses)'}", hint="check the path")
    name = errno.errorcode.get(code, str(code)) if code else type(err).__name__
    return RunFailed(
        f"the operating system refused{where or ' an operation'}: {reason} ({name})",
        hint="fix that and run the same command again (with -v for where it happened)",
    )
