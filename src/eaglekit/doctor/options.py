"""`eaglekit doctor`'s options, declared once (`eaglekit.options`): its flags, the recipe keys of the
`doctor` section and `run_doctor`'s defaults. The draft folder is the command's one positional
argument. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.errors import EaglekitError
from eaglekit.formats.registry import FORMATS
from eaglekit.options import json_option, option
from eaglekit.targets.options import target_option

ENGINES = tuple(FORMATS)  # an engine per format (formats/registry.py)
DTYPES = ("bfloat16", "float32", "float16", "bf16", "fp32", "fp16")
GROUPS = {"main": None}


@dataclass(frozen=True, kw_only=True)
class DoctorOptions:
    target: str = target_option()
    engine: str | None = option(
        None,
        "the engine to check for (default: the one the folder's format is made for)",
        group="main",
        choices=ENGINES,
    )
    probe: str | None = option(
        None,
        "run the live probe on a prompts file (no value: built-in prompts)",
        group="main",
        flag={"nargs": "?", "const": "builtin", "metavar": "PROMPTS"},
    )
    k: int | None = option(
        None,
        "draft tokens per step in the probe (--k as in bench; default: the folder's "
        "speculative_tokens, what vLLM serves it at, else 3)",
        group="main",
        aliases=("-k",),
    )
    max_new_tokens: int = option(64, "continuation length per prompt", group="main")
    limit: int = option(
        6, "the probe uses the first N prompts, as bench's --limit", group="main", aliases=("--num-prompts",)
    )
    device: str = option("auto", "where the target runs for the probe (auto: the GPU when there is one)", group="main")
    dtype: str = option("bfloat16", "the dtype the probe runs in: the one you serve in", group="main", choices=DTYPES)
    diagnose: bool = option(False, "run the diagnosis even when acceptance is fine", group="main")
    allow_unfinished: bool = option(
        False, "check a draft whose training did not finish (refused otherwise; the report says so)", group="main"
    )
    json: str | None = json_option("the report")
    out: str | None = option(None, "also write report.json and manifest.json into this folder", group="main")

    def __post_init__(self):
        for name in ("limit", "max_new_tokens"):  # a probe of 0 prompts or 0 tokens measures nothing
            if getattr(self, name) < 1:
                raise EaglekitError(
                    f"--{name.replace('_', '-')} {getattr(self, name)}: the probe would measure nothing",
                    hint="pass 1 or more",
                )
        if self.k is not None and self.k < 1:
            raise EaglekitError(f"--k {self.k}: the probe drafts no token", hint="pass --k 1 or more")
