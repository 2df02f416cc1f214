"""`eaglekit target info`'s and `target prepare`'s options, declared once (`eaglekit.options`): their
flags and `prepare_target`'s defaults. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.options import json_option, option
from eaglekit.targets.source import DEFAULT_TARGET

GROUPS = {"main": None}
TARGET_HELP = f"{DEFAULT_TARGET}, an HF model folder or a .gguf file"


def target_option(group: str = "main"):
    """The --target every stage takes: one default, one help."""
    return option(DEFAULT_TARGET, TARGET_HELP, group=group)


@dataclass(frozen=True, kw_only=True)
class TargetInfoOptions:
    target: str = target_option()
    json: str | None = json_option("the target's description")


@dataclass(frozen=True, kw_only=True)
class TargetPrepareOptions:
    target: str = target_option()
    out: str = option(help="output folder", group="main", required=True)
    dtype: str = option("float32", "dtype of the saved weights (float32, bfloat16)", group="main")
    overwrite: bool = option(False, "replace an existing output folder", group="main")
