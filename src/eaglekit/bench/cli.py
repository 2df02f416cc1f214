"""`eaglekit bench`: tau, acceptance and speedup of a draft in eaglekit's engine, against plain
decoding in the same engine and HF `generate`."""

from __future__ import annotations

import argparse
import shlex
import sys

from eaglekit.artifacts import emit_json
from eaglekit.bench.options import GROUPS, BenchOptions
from eaglekit.options import add_options, options_argv, options_from_args


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure tau, per-position acceptance and speedup of a draft", description=__doc__)
    add_options(p, BenchOptions, GROUPS)
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The command as typed, or rebuilt from the options when bench runs inside `eaglekit run`."""
    if sys.argv[1:2] == ["bench"]:
        return shlex.join(["eaglekit", *sys.argv[1:]])
    return shlex.join(["eaglekit", "bench", *options_argv(BenchOptions, args)])


def run(args: argparse.Namespace) -> int:
    from eaglekit.bench.benchmark import bench_out, benchmark, write_outputs
    from eaglekit.bench.report import markdown

    cfg = options_from_args(BenchOptions, args)
    with bench_out(cfg) as out:  # --out is this bench's alone from here to its last file
        result = benchmark(cfg, command=command_line(args))
        write_outputs(result, cfg, out)
    if emit_json(result, cfg.json):
        return 0
    print(markdown(result))
    if result.get("plot_note"):
        print(result["plot_note"])
    print(f"wrote {cfg.out}/results.json, report.md, manifest.json")
    return 0
