"""`eaglekit export`'s and `eaglekit import`'s options, declared once (`eaglekit.options`): their flags,
the recipe keys of the `export` section and `export_draft`'s defaults. The folder each reads is the
command's one positional argument."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.formats.registry import FORMATS
from eaglekit.options import int_tuple, option

GROUPS = {"main": None}


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    format: str = option(help="the serving format", group="main", choices=tuple(sorted(FORMATS)), required=True)
    out: str = option(help="output folder", group="main", required=True)
    target: str | None = option(None, "the target (checks it is the draft's; named as vLLM's verifier)", group="main")
    dtype: str = option("bfloat16", "dtype of the exported weights", group="main")
    speculative_tokens: int = option(3, "draft tokens per step (vLLM config)", group="main")
    overwrite: bool = option(False, "replace an existing output folder", group="main")
    allow_unfinished: bool = option(
        False, "export a draft whose training did not finish (refused otherwise; the export says so)", group="main"
    )


@dataclass(frozen=True, kw_only=True)
class ImportOptions:
    out: str = option(help="native checkpoint folder to write", group="main", required=True)
    target: str | None = option(None, "the target (needed when the config names no aux layers)", group="main")
    aux_layer_ids: tuple[int, ...] | None = option(
        None, "override, eaglekit convention (output of 0-based layer i), e.g. 1,14,25", group="main", parse=int_tuple
    )
    overwrite: bool = option(False, "replace an existing output folder", group="main")
