"""`eaglekit bench`'s options, declared once (`eaglekit.options`): the engine's (speculation shape,
sampling, runtime: `eaglekit.engine.options`) and bench's own. Its flags, the recipe keys of the
`bench` section and the benchmark's config are all these fields. No torch here."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eaglekit.engine.options import GROUPS, EngineOptions
from eaglekit.engine.spec import SpecConfig
from eaglekit.errors import EaglekitError
from eaglekit.options import json_option, option

__all__ = ["GROUPS", "SWEEP_PROMPTS", "BenchOptions"]

SWEEP_PROMPTS = 4  # --sweep tries its shapes on this many prompts unless --sweep-prompts says otherwise
# The shapes --sweep tries unless --sweep-shapes names others (EAGLE-2/3 use trees of depth 6-8, top-k
# 10, 60 tokens on 7-8B targets). Four: on a GPU each costs one compile of its cycle (~40-60 s for
# SmolLM2), and they run on the first --sweep-prompts prompts only (the chosen one then on all), so a
# sweep stays within a few minutes. On a CPU every verified row is compute, and the fastest shapes were
# short chains (a GPU-trained draft: BENCHMARKS.md, docs/results/2026-12-04-cpu-chain-length).
SWEEP_SHAPES = "chain:3,chain:5,tree:4/4/16,tree:6/8/32"
CPU_SWEEP_SHAPES = "chain:1,chain:2,chain:3,tree:2/2/4"


@dataclass(frozen=True, kw_only=True)
class BenchOptions(EngineOptions):
    draft: str = option(
        help="a draft folder (eaglekit, SGLang, speculators or EAGLE), `oracle` (replays the target's "
        "greedy answer: engine overhead) or `random` (random weights: draft cost, no acceptance); "
        "these two speculate throughout, without the plain fallback",
        group="main",
        required=True,
    )
    prompts: str | None = option(
        None,
        "JSONL ({id, turns} / {messages} / {prompt}) or an `eaglekit prompts` folder (default: a small built-in set)",
        group="main",
    )
    limit: int | None = option(None, "only the first N prompts", group="main")
    sweep: bool = option(
        False,
        "try several chain lengths and tree shapes (on a CPU: chains of 1-3 and a 4-node tree), "
        "and the shape --mode/--k/--depth/... give, on the first --sweep-prompts prompts; pick "
        "the fastest, say why, and bench it on all prompts",
        group="main",
    )
    sweep_prompts: int | None = option(
        None,
        f"with --sweep: the prompts the shapes are tried on (the first N; "
        f"default {SWEEP_PROMPTS}); the chosen shape then runs on all of them",
        group="main",
    )
    sweep_shapes: str | None = option(
        None,
        "with --sweep: the shapes tried, comma-separated chain:K and tree:DEPTH/TOP_K/TOTAL_TOKENS "
        f"(default {SWEEP_SHAPES} on a GPU, {CPU_SWEEP_SHAPES} on a CPU, and the shape --mode/--k/... "
        "give; named here, these alone)",
        group="main",
    )
    hf: bool = option(True, "skip HF generate", group="main")
    hf_prompts: int = option(
        8,
        "HF generate on the first N prompts only (all their turns), compared with plain and "
        "speculative decoding on the same prompts; HF runs tens of times slower than the "
        "engine (BENCHMARKS.md), so all of MT-bench costs minutes (0: all prompts)",
        group="main",
    )
    warmup: int = option(1, "untimed warm-up generations per method", group="main")
    allow_unfinished: bool = option(
        False, "bench a draft whose training did not finish (refused otherwise; the results say so)", group="main"
    )
    json: str | None = json_option("the results")
    out: str = option("runs/bench", "output folder (results.json, report.md, plot, manifest)", group="main")
    overwrite: bool = option(
        False, "replace an existing output folder (a finished bench is refused otherwise)", group="main"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.limit is not None and self.limit < 1:  # 0 once read as "all prompts"
            raise EaglekitError(
                f"--limit {self.limit}: no prompt to bench", hint="pass --limit 1 or more, or leave it out for all"
            )
        if self.sweep_prompts is not None:
            if not self.sweep:
                raise EaglekitError(
                    f"--sweep-prompts {self.sweep_prompts} without --sweep: there is no sweep to run on those prompts",
                    hint="add --sweep, or leave --sweep-prompts out",
                )
            if self.sweep_prompts < 1:
                raise EaglekitError(
                    f"--sweep-prompts {self.sweep_prompts}: the sweep needs a prompt to try its shapes on",
                    hint=f"pass --sweep-prompts 1 or more (default {SWEEP_PROMPTS}), or leave it out",
                )

        if self.sweep_shapes is not None:
            if not self.sweep:
                raise EaglekitError(
                    f"--sweep-shapes {self.sweep_shapes} without --sweep: there is no sweep to try them in",
                    hint="add --sweep, or bench one shape with --mode/--k/--depth/--tree-top-k/--total-tokens",
                )
            self.sweep_specs("cpu")  # a shape that does not parse fails here, before any model loads

    def sweep_specs(self, device: str) -> tuple[SpecConfig, ...]:
        """The shapes --sweep tries on this device, in order, each once."""
        default = SWEEP_SHAPES if device.startswith("cuda") else CPU_SWEEP_SHAPES
        texts = [t for t in (self.sweep_shapes or default).split(",") if t.strip()]
        if not texts:
            raise EaglekitError("--sweep-shapes names no shape", hint=f"e.g. --sweep-shapes {SWEEP_SHAPES}")
        specs = {}
        for text in texts:
            spec = SpecConfig.parse(text)
            specs.setdefault(spec.label(), spec)
        return tuple(specs.values())

    @property
    def sweep_prompt_count(self) -> int:
        """How many prompts --sweep tries its shapes on (the first ones)."""
        return self.sweep_prompts if self.sweep_prompts is not None else SWEEP_PROMPTS

    def to_dict(self) -> dict:
        """The options as given, with the speculation shape and sampling they resolve to."""
        return {**asdict(self), "spec": self.spec_config().to_dict(), "sampling": self.sampling().to_dict()}
