"""The `eaglekit` command: one subcommand per stage, each defined in its stage's `cli` module.

A stage's `cli` module exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func` (taking the parsed args, returning an exit status). Heavy imports happen inside `func`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import tempfile
from pathlib import Path

from eaglekit import __version__
from eaglekit.errors import EaglekitError, from_os_error

log = logging.getLogger(__name__)

STAGE_CLIS = (
    "eaglekit.formats.target_cli",  # `eaglekit target`: above targets/, for every format's aux ids
    "eaglekit.pipeline.cli",
    "eaglekit.train.vocab_cli",
    "eaglekit.features.cli",
    "eaglekit.train.cli",
    "eaglekit.formats.cli",
    "eaglekit.doctor.cli",
    "eaglekit.data.cli",
    "eaglekit.engine.cli",
    "eaglekit.bench.cli",
    "eaglekit.report.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eaglekit", description="Train, verify, export and benchmark EAGLE-3 speculative-decoding drafts."
    )
    parser.add_argument("--version", action="version", version=f"eaglekit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in STAGE_CLIS:
        importlib.import_module(name).register(sub)
    return parser


# Commands whose --out names a file, not a folder.
FILE_OUTS = {"report"}


def check_out(path: str, *, folder: bool = True) -> None:
    """Refuse an --out no stage could write, before anything loads: a file where a folder is meant
    (or the reverse), a symlink loop or a dangling link, a parent that is a file, a read-only folder
    or mount. What remains (a disk that fills up) is reported when it happens."""
    out = Path(path)
    try:
        out.stat()  # follows links: a loop raises ELOOP
        exists = True
    except FileNotFoundError:
        exists = False
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise EaglekitError(
                f"--out {path} is a symlink loop (a link that leads back to itself)",
                hint="fix or remove the link, or pass another --out",
            ) from err
        if err.errno == errno.ENOTDIR:
            raise EaglekitError(
                f"--out {path} lies inside a file, not a folder", hint="pass a path whose parents are folders"
            ) from err
        raise from_os_error(err) from err
    if not exists and out.is_symlink():
        raise EaglekitError(
            f"--out {path} is a link to {os.readlink(out)}, which does not exist",
            hint="remove the link, or make the folder it points to",
        )
    if exists and folder and not out.is_dir():
        raise EaglekitError(
            f"--out {path} is a file, not a folder",
            hint="pass a folder path (a new one is created), or move that file away",
        )
    if exists and not folder and out.is_dir():
        raise EaglekitError(f"--out {path} is a folder, not a file", hint="pass a file path")
    # The folder that will hold what is written: --out itself, or its nearest existing parent.
    holder = out if exists and folder else out.absolute().parent
    while not holder.exists() and holder != holder.parent:
        holder = holder.parent
    if not holder.is_dir():
        raise EaglekitError(f"--out {path} lies inside {holder}, which is a file", hint="pass a path inside a folder")
    try:  # a real write, removed at once: os.access() misses read-only mounts and some sandboxes
        os.rmdir(tempfile.mkdtemp(prefix=".eaglekit-probe-", dir=holder))
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            why = "a read-only file system" if err.errno == errno.EROFS else "read-only for this user"
            raise EaglekitError(
                f"--out {path} cannot be written: {holder} is {why}",
                hint="pass an --out on a writable disk, or make that folder writable",
            ) from err
        raise from_os_error(err) from err


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        if getattr(args, "out", None) and not getattr(args, "plan", False):  # --plan writes nothing
            check_out(args.out, folder=args.command not in FILE_OUTS)
        return int(args.func(args) or 0)
    except EaglekitError as err:
        return report(err)
    except BrokenPipeError:  # `eaglekit ... | head`
        return 0
    except Exception as err:
        # The operating system's refusals (disk full, permission denied, a read-only mount ...) are a
        # sentence with the fix; anything else is a bug and keeps its traceback.
        known = from_os_error(err)
        if known is None:
            raise
        log.debug("the operating system's error, in full:", exc_info=True)
        return report(known)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def report(err: EaglekitError) -> int:
    """Print a user-facing error; its exit status (2: bad input, 1: a run that failed)."""
    print(f"error: {err}", file=sys.stderr)
    return err.exit_code
