"""`eaglekit report RUN_DIR`: the run's report as one self-contained HTML page (`eaglekit run` writes it too)."""

from __future__ import annotations

import argparse

from eaglekit.options import add_options
from eaglekit.report.options import GROUPS, ReportOptions


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="one self-contained HTML page of a run folder",
        description="Read what the stages of a run folder wrote (pipeline.json, the training log and "
        "manifest, the doctor's and the bench's JSON, the scaling summary) and write one "
        "HTML page with inline plots: training curves, the data-scaling curve, "
        "acceptance, speed against the baselines, the doctor's table. Missing parts are "
        "shown as missing, unfinished stages as unfinished.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="a folder written by `eaglekit run` (e.g. runs/quick)")
    add_options(p, ReportOptions, GROUPS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.report.html import write_report

    print(f"wrote {write_report(args.run, args.out)}")
    return 0
