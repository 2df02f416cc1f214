"""The `eaglekit` command: one subcommand per stage, each defined in its stage's `cli` module.

A stage's `cli` module exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func` (taking the parsed args, returning an exit status). Heavy imports happen inside `func`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from eaglekit import __version__
from eaglekit.errors import EaglekitError

STAGE_CLIS = (
    "eaglekit.targets.cli",
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
        prog="eaglekit",
        description="Train, verify, export and benchmark EAGLE-3 speculative-decoding drafts.")
    parser.add_argument("--version", action="version", version=f"eaglekit {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in STAGE_CLIS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EaglekitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `eaglekit ... | head`
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
