"""`eaglekit target info`'s and `target prepare`'s options, declared once (`eaglekit.options`): their
flags and `prepare_target`'s defaults. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.options import option

GROUPS = {"main": None}
TARGET_HELP = "smollm2, an HF model folder or a .gguf file"


@dataclass(frozen=True, kw_only=True)
class TargetInfoOptions:
    target: str = option("smollm2", TARGET_HELP, group="main")
    json: bool = option(False, "print JSON", group="main")


@dataclass(frozen=True, kw_only=True)
class TargetPrepareOptions:
    target: str = option("smollm2", TARGET_HELP, group="main")
    out: str = option(help="output folder", group="main", required=True)
    dtype: str = option("float32", "dtype of the saved weights (float32, bfloat16)", group="main")
    overwrite: bool = option(False, "replace an existing output folder", group="main")
