"""`eaglekit run`: the whole pipeline from one recipe."""

from __future__ import annotations

import argparse

from eaglekit.options import add_options
from eaglekit.pipeline.options import GROUPS, RunOptions


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        help="the whole pipeline: prompts -> answers -> draft -> export -> doctor -> bench",
        description="Run every stage of a recipe into one folder. Rerun the same command to resume.",
    )
    add_options(p, RunOptions, GROUPS)
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="SECTION.KEY=VALUE",
        help="override recipe values, e.g. train.epochs=3 generate.batch-size=64",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eaglekit.pipeline.keys import check_recipe_keys
    from eaglekit.pipeline.recipe import load_recipe
    from eaglekit.pipeline.run import run_pipeline

    recipe = load_recipe(args.recipe, args.overrides)
    check_recipe_keys(recipe)  # a misspelled key fails now, not after the data stages
    if args.plan:
        from eaglekit.pipeline.run import plan_pipeline

        print("\n".join(plan_pipeline(recipe, args.out)))
        return 0
    state = run_pipeline(recipe, args.out, stop_before=args.stop_before)
    for name, stage in state["stages"].items():
        print(f"{name:<18} {stage['status']:<8} {stage['seconds']:>8.1f} s  exit {stage['exit_code']}")
    print(state["summary"])
    if state.get("stopped_before"):
        return 0
    return 0 if state["doctor_ok"] else 1
