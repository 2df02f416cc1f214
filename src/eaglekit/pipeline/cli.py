"""`eaglekit run`: the whole pipeline from one recipe."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("run", help="the whole pipeline: prompts -> answers -> draft -> export -> doctor -> bench",
                       description="Run every stage of a recipe into one folder. Rerun the same command to resume.")
    p.add_argument("--recipe", default="quick", help="a built-in recipe name or a YAML file (default: quick)")
    p.add_argument("--out", help="run folder (default: runs/<recipe name>)")
    p.add_argument("--stop-before", metavar="STAGE",
                   help="stop when this stage is next (e.g. train): run the data stages now, the rest later "
                        "by rerunning without it; finished stages are skipped")
    p.add_argument("--plan", action="store_true", help="print every stage's command and run none")
    p.add_argument("overrides", nargs="*", metavar="SECTION.KEY=VALUE",
                   help="override recipe values, e.g. train.epochs=3 generate.batch-size=64")
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
