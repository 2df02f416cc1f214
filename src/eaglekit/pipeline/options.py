"""`eaglekit run`'s options, declared once (`eaglekit.options`). Its SECTION.KEY=VALUE overrides are
the command's positional arguments; the recipe's own keys are the stages' options."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.options import option

GROUPS = {"main": None}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    recipe: str = option("quick", "a built-in recipe name or a YAML file", group="main")
    out: str | None = option(None, "run folder (default: runs/<recipe name>)", group="main")
    stop_before: str | None = option(
        None,
        "stop when this stage is next (e.g. train): run the data stages now, the "
        "rest later by rerunning without it; finished stages are skipped",
        group="main",
        flag={"metavar": "STAGE"},
    )
    plan: bool = option(False, "print every stage's command and run none", group="main")
