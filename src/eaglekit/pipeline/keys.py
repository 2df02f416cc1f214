"""Check a recipe's section keys against the real flags of the stage each section feeds.

A misspelled key (`train.epochz=3`) would otherwise become a flag the stage refuses only when its
turn comes, after the stages before it ran (the data stages take most of a run), or, for a
section the pipeline reads itself, be ignored. Checked before anything runs, from the stages'
own argument parsers, so the list of valid keys can never drift from the CLI.
"""

from __future__ import annotations

import argparse
import difflib

from eaglekit.cli import build_parser
from eaglekit.errors import EaglekitError

# section -> (the subcommand its keys are flags of, keys the pipeline reads itself)
SECTION_COMMANDS = {
    "synthesize": (("prompts", "synthesize"), {"add"}),
    "validation": (("prompts", "build"), set()),
    "generate": (("generate",), set()),
    "features": (("features",), set()),
    "train": (("train",), set()),
    "export": (("export",), {"formats"}),
    "doctor": (("doctor",), {"engine"}),
    "bench": (("bench",), set()),
}


def check_recipe_keys(recipe: dict) -> None:
    """Refuse a section key that is not a flag of the section's stage, naming the valid ones."""
    for section, value in recipe.items():
        command = section_command(recipe, section)
        if command is None or not isinstance(value, dict):
            continue
        path, own = command
        valid = stage_flags(path) | own
        for key, given in value.items():
            flag = str(key).replace("_", "-")
            if given is not None and flag not in valid:  # KEY=null unsets it (no flag)
                if path == ("prompts", "build") and flag in stage_flags(("prompts", "synthesize")):
                    # a recipe that synthesizes (quick) given prompts.source=FILE: its Magpie keys stay behind
                    raise EaglekitError(
                        f"recipe key prompts.{key} is a Magpie option, and with prompts.source the prompts "
                        "section is `eaglekit prompts build`'s",
                        hint=f"drop it (prompts.{key}=null), or move it to the synthesize section "
                        f"(synthesize.{key}=..., with synthesize.add=N to top your files up with Magpie prompts)",
                    )
                raise unknown_key_error(section, str(key), path, valid)


def section_command(recipe: dict, section: str) -> tuple[tuple[str, ...], set[str]] | None:
    """The subcommand a section's keys are flags of (None: a section this check does not own)."""
    if section == "prompts":  # files are built, Magpie synthesizes when there are none
        return (
            (("prompts", "build"), set())
            if (recipe.get("prompts") or {}).get("source")
            else (("prompts", "synthesize"), set())
        )
    return SECTION_COMMANDS.get(section)


def stage_flags(path: tuple[str, ...]) -> set[str]:
    """The long flags of `eaglekit <path...>`, without dashes (`max-new-tokens`, ...)."""
    parser = build_parser()
    for name in path:
        parser = subcommands(parser)[name]
    return {flag[2:] for flag in parser._option_string_actions if flag.startswith("--")} - {"help"}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    raise KeyError(f"{parser.prog} has no subcommands")


def unknown_key_error(section: str, key: str, path: tuple[str, ...], valid: set[str]) -> EaglekitError:
    close = difflib.get_close_matches(key.replace("_", "-"), sorted(valid), n=1)
    guess = f"did you mean {section}.{close[0]}? " if close else ""
    return EaglekitError(
        f"recipe key {section}.{key} is not an option of `eaglekit {' '.join(path)}`",
        hint=f"{guess}valid keys of {section}: {', '.join(sorted(valid))}",
    )
