"""Chain the stages of a recipe into one run folder, resuming where an earlier run stopped.

    runs/<name>/
      target/        the target as a plain HF folder (loads in seconds; vLLM can serve it)
      prompts/       `eaglekit prompts build|synthesize` (prompts-files/ when Magpie tops the files up)
      conversations/ `eaglekit generate`
      features/      `eaglekit features` (offline store; `features: false` trains online instead)
      val-*/         with `validation: {source: FILE}`: the workload's own prompts, answered, as
                     training's validation set (what it predicts and selects the draft on)
      draft/         `eaglekit train` (the best checkpoint + trainer state)
      export/<fmt>/  `eaglekit export`
      doctor/        `eaglekit doctor --json` on the vLLM export, with the live probe
      bench/         `eaglekit bench`
      scaling/       with `scaling: {fractions: [...]}`: one draft per nested slice of the data (pipeline/scaling.py)
      pipeline.json  which stages finished, with the exact command of each
      report.html    `eaglekit report`: the page a person looks at, rewritten at the end of every run

Each stage runs through its own subcommand (the same code path as running it alone). A stage
recorded as finished with the same command is skipped (its paths inside the run folder read as in
the folder it is in now: a run folder moved or copied goes on where it was), unless what it read
changed since: a stage whose output folder its command names finished again, or a file of the
user's it names (prompts, an HF target folder's files) has another size or mtime. It then runs
again with --overwrite, as does a finished stage whose command changed (an edited recipe), with a
warning naming the flags. A stage that was interrupted is run again with its own resume (generate
resumes by itself, train gets --resume). `gpus: N` answers the prompts with one worker per GPU and
trains with torchrun on N GPUs of this host (DDP).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import importlib
import io
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from eaglekit.artifacts import (
    BENCH_RESULTS,
    DOCTOR_REPORT,
    MANIFEST,
    PIPELINE_STATE,
    RUN_BENCH,
    RUN_DOCTOR,
    RUN_DRAFT,
    RUN_EXPORT,
    TRAINER_STATE,
    made_before,
    missing_outputs,
    read_json,
    settle_folder,
    write_json,
    writer_lock,
)
from eaglekit.cli import build_parser, main
from eaglekit.data.options import LOCAL_BACKENDS, GenerateOptions
from eaglekit.draft.config import LAYOUT_KEYS
from eaglekit.engine.spec import SpecConfig
from eaglekit.errors import EaglekitError
from eaglekit.features.options import FeaturesOptions
from eaglekit.formats.registry import FORMATS
from eaglekit.pipeline.recipe import to_flags
from eaglekit.pipeline.scaling import StepsNotKnownYet, run_scaling, scaling_plan, scaling_summary
from eaglekit.progress import StageTime, TimeLeft, duration, run_after, run_outlook, stage_and_after
from eaglekit.report.html import write_report
from eaglekit.targets.source import DEFAULT_TARGET
from eaglekit.train.config import TrainConfig
from eaglekit.train.manifest import draft_manifest_path, prediction_text, read_draft_manifest, steps_done

log = logging.getLogger(__name__)
STATE = PIPELINE_STATE


class PlannedStage(NamedTuple):
    name: str
    argv: list[str]
    processes: int = 1

    def command(self) -> str:
        return shlex.join(command_line(self.argv, self.processes))


class Pipeline:
    def __init__(self, recipe: dict, out: Path, stop_before: str | None = None, plan: list[PlannedStage] | None = None):
        self.recipe = recipe
        self.out = out
        self.stop_before = stop_before
        self.plan = plan  # a list: collect each stage instead of running it (`eaglekit run --plan`)
        self.whole_plan: list[PlannedStage] = []  # the stages as planned, for the run's time left
        self.plan_is_whole = True  # False: the plan stopped at a stage that needs an earlier output
        self.ahead: list[tuple[str, StageTime | None]] = []  # the stages after the running one, each's known time
        self.state_path = out / STATE
        self.state = moved_here(
            read_json(self.state_path, "pipeline state")
            if self.state_path.is_file() and plan is None
            else {"stages": {}},
            out,
        )
        self.started = time.time()

    @property
    def planned(self) -> list[str] | None:
        """The names of every stage this run will pass, for "stage k of N" (None: not known yet)."""
        return [s.name for s in self.whole_plan] if self.plan_is_whole else None

    def stage(
        self,
        name: str,
        argv: list[str],
        *,
        resume_flag: str | None = None,
        resume_marker: Path | None = None,
        ok_codes=(0,),
        processes: int = 1,
    ) -> int:
        """Run `eaglekit <argv>` unless it already finished with this exact command.

        An interrupted stage gets `resume_flag` when `resume_marker` exists (the state it resumes from).
        With `processes` > 1 the stage runs under torchrun (one process per GPU, DDP).
        """
        if name == self.stop_before:
            raise StopBefore(name)
        if self.plan is not None:
            self.plan.append(PlannedStage(name, argv, processes))
            return 0
        done = self.state["stages"].get(name)
        if finished(self.state, name, argv, self.out):
            log.info("[%s] done earlier, skipped (%s)", name, shlex.join(["eaglekit", *argv]))
            return done["exit_code"]
        upstream = upstream_runs(self.state, name, argv)
        stale = stale_inputs(self.state, name, argv, self.out)
        damaged = damaged_output(done, argv)
        # An interrupted --overwrite left the old output in place (artifacts.settle_replace): replaced again, not resumed.
        replacing = bool(
            done
            and done["argv"] == argv
            and done["status"] != "done"
            and "--overwrite" in done.get("extra", [])
            and overwrites(argv)
        )
        resumed = bool(
            not stale
            and not damaged
            and not replacing
            and done
            and done["argv"] == argv
            and resume_flag
            and resume_marker is not None
            and resume_marker.exists()
        )
        extra = [resume_flag] if resumed else []
        if replacing:
            log.warning(
                "[%s] an earlier run replacing its output stopped before the end (the output it was "
                "replacing was kept): it replaces it again (--overwrite)",
                name,
            )
            extra = ["--overwrite"]
        if damaged:
            # Skipped as "done earlier" while its files were gone (a deleted draft/model.safetensors).
            log.warning(
                "[%s] its output no longer matches its manifest (%s): it runs again%s",
                name,
                "; ".join(damaged[:3]),
                " (--overwrite)" if overwrites(argv) else "",
            )
            extra = ["--overwrite"] if overwrites(argv) and "--overwrite" not in argv else []
        if (
            not resumed
            and not stale
            and done
            and done["argv"] == argv
            and done["status"] != "done"
            and resume_flag
            and overwrites(argv)
            and "--overwrite" not in argv
        ):
            # Stopped before it saved anything to resume from (the quick recipe's 60 steps once ran
            # under the default --save-every 200): what it left is a partial log, so it starts again.
            log.warning(
                "[%s] stopped earlier before it saved a state to resume from: it starts again (--overwrite)", name
            )
            extra = ["--overwrite"]
        changed = changed_args(done["argv"], argv) if done and done["argv"] != argv else []
        if stale or changed:
            # What it made came from an earlier run of these stages, or from other settings (the
            # recipe was edited): made again, never kept or resumed.
            why = (
                f"{', '.join(stale)} changed since this stage ran"
                if stale
                else f"its settings changed ({', '.join(changed)})"
            )
            log.warning(
                "[%s] %s: its output is out of date, so it runs again%s",
                name,
                why,
                " (--overwrite)" if overwrites(argv) else "",
            )
            extra = ["--overwrite"] if overwrites(argv) and "--overwrite" not in argv else []
        where = (
            f"stage {self.planned.index(name) + 1} of {len(self.planned)}, "
            if self.planned and name in self.planned
            else ""
        )
        log.info(
            "[%s] %s (%sthe run so far: %s)",
            name,
            shlex.join(["eaglekit", *argv, *extra]),
            where,
            duration(time.time() - self.started),
        )
        self.look_ahead(name)
        log.info("[%s] %s", name, self.time_left(name, None).text())
        files = input_files(argv, self.out)
        self.record(name, argv, "running", None, 0.0, upstream=upstream, files=files, extra=extra)
        start = time.time()
        # The stage's progress lines end with the run's time left: in this process through run_outlook,
        # in the processes it starts (torchrun's ranks, --devices workers) through the environment.
        own = known_stage_time(self.stage_planned(name), self.state, self.out)
        with (
            run_outlook(lambda left: self.time_left(name, None if left is None else StageTime(left)).text()),
            run_after(name, own, self.time_after()),
        ):
            code, crash = run_stage(argv + extra, processes)
        release_device_memory()
        seconds = round(time.time() - start, 1)
        if code not in ok_codes:
            command = shlex.join(["eaglekit", *argv, *extra])
            if code == 2 and done and done["status"] == "done":
                # Refused (bad input): it changed nothing, so neither does the record. Recorded, the refused
                # command read as "settings changed" on the next run, whose --overwrite emptied the output.
                self.state["stages"][name] = done
                write_json(self.state_path, self.state)
                raise EaglekitError(
                    f"stage {name} refused its input (exit 2): {command}; its earlier output and "
                    "record are kept as they were",
                    hint="fix the value it names above and rerun `eaglekit run`",
                )
            self.record(name, argv, "failed", code, seconds, upstream=upstream, files=files, extra=extra)
            if code == 130:
                raise EaglekitError(
                    f"interrupted in stage {name}: {command}",
                    hint="rerun the same `eaglekit run` command: finished stages are skipped, and "
                    "this one resumes from its last saved state where it has one",
                )
            raise EaglekitError(
                f"stage {name} failed (exit {code}{': ' + crash if crash else ''}): {command}",
                hint="fix the cause and rerun `eaglekit run`; finished stages are skipped",
            )
        self.record(name, argv, "done", code, seconds, resumed=resumed, upstream=upstream, files=files, extra=extra)
        return code

    def record(
        self,
        name: str,
        argv: list[str],
        status: str,
        code: int | None,
        seconds: float,
        resumed: bool = False,
        upstream: dict | None = None,
        files: dict | None = None,
        extra: list[str] | None = None,
    ) -> None:
        """`resumed`: the seconds cover only the part after the resume (no measure of the whole stage).
        `upstream`: when each stage whose output this one reads had finished (`upstream_runs`); `ran`:
        when this one finished, what a later stage reading its output records. `files`: the user's
        input files it read, as `input_files` saw them. `extra`: the flags the run added (--resume,
        --overwrite)."""
        self.state["stages"][name] = {
            "argv": argv,
            "status": status,
            "exit_code": code,
            "seconds": seconds,
            "resumed": resumed,
            "upstream": upstream or {},
            "files": files or {},
            "extra": extra or [],
            **({"ran": time.time()} if status == "done" else {}),
        }
        write_json(self.state_path, self.state)

    def look_ahead(self, name: str) -> None:
        """At a stage's start: the stages after it that will run, and what each is known to take."""
        if not self.plan_is_whole:  # the stage it stopped at may be plannable now (the main draft is done)
            self.whole_plan, self.plan_is_whole = plan_so_far(self.recipe, self.out)
        names = [s.name for s in self.whole_plan]
        after = self.whole_plan[names.index(name) + 1 :] if name in names else []
        after = [s for s in until_stop(after, self.stop_before) if not finished(self.state, s.name, s.argv, self.out)]
        self.ahead = [(s.name, known_stage_time(s, self.state, self.out)) for s in after]

    def time_left(self, name: str, own: StageTime | None) -> TimeLeft:
        """The run's time left while `name` runs: its own (`own`, else what is known of it) and the rest."""
        own = own or known_stage_time(self.stage_planned(name), self.state, self.out)
        return stage_and_after(name, own, self.time_after())

    def time_after(self) -> TimeLeft:
        """The time left of the stages after the running one (`look_ahead`'s)."""
        unplanned = "the scaling slices (planned once train is done)" if self.runs_unplanned_stages() else None
        return run_time_left(self.ahead, unplanned)

    def stage_planned(self, name: str) -> PlannedStage | None:
        return next((s for s in self.whole_plan if s.name == name), None)

    def runs_unplanned_stages(self) -> bool:
        """The plan stopped short (at scaling, the only stage whose plan needs an earlier output) and
        --stop-before does not stop the run before that point."""
        if self.plan_is_whole:
            return False
        return not self.stop_before or (
            self.stop_before != "scaling" and self.stop_before not in {s.name for s in self.whole_plan}
        )


def moved_here(state: dict, out: Path) -> dict:
    """The state with its stages' commands as they read in `out`: a run folder copied or moved (or
    named otherwise, relative or absolute) held its old path in every command, so each finished
    stage ran again and an interrupted train was not resumed. Paths inside the folder where it was
    recorded (`run_dir`) are rewritten to `out`; every other path (the user's prompts, a target
    elsewhere) stays as given and is compared as it is."""
    was, now = state.get("run_dir") or recorded_run_dir(state), str(out)
    if was and was != now:
        log.info("%s was recorded in %s: its stages' paths there are read as in %s", STATE, was, now)
        for rec in state["stages"].values():
            rec["argv"] = [
                now + arg[len(was) :] if arg == was or arg.startswith(was + "/") else arg for arg in rec["argv"]
            ]
    state["run_dir"] = now
    return state


def recorded_run_dir(state: dict) -> str | None:
    """Where a state recorded before `run_dir` was (each stage writes a folder of the run folder,
    or one inside such a folder: export/vllm): the common folder of their outputs' parents."""
    parents = [os.path.dirname(out) for rec in state["stages"].values() if (out := stage_output(rec["argv"]))]
    if not parents:
        return None
    try:
        return os.path.commonpath(parents) or None
    except ValueError:  # absolute and relative mixed: none
        return None


def finished(state: dict, name: str, argv: list[str], run_dir: Path) -> bool:
    """Recorded as done with this exact command, on the output its upstream stages hold now, and its
    own output still as its manifest lists it: skipped."""
    done = state["stages"].get(name)
    return (
        bool(done)
        and done["argv"] == argv
        and done["status"] == "done"
        and not stale_inputs(state, name, argv, run_dir)
        and not damaged_output(done, argv)
    )


def damaged_output(done: dict | None, argv: list[str]) -> list[str]:
    """What is gone from a finished stage's output folder since it ran (`artifacts.missing_outputs`):
    the folder, its manifest, a file the manifest lists or its size. Empty for a stage not done."""
    out = stage_output(argv)
    if not done or done["status"] != "done" or out is None:
        return []
    return missing_outputs(out)


def changed_args(before: list[str], now: list[str]) -> list[str]:
    """The flags whose values differ between two commands of a stage, as `--flag old -> new`."""

    def flags(argv):
        out, key = {}, None
        for arg in argv:
            if arg.startswith("--"):
                key = arg
                out[key] = ""
            elif key is not None:
                out[key] = f"{out[key]} {arg}".strip()
        return out

    a, b = flags(before), flags(now)
    return [
        f"{k} {a.get(k, '(unset)') or 'on'} -> {b.get(k, '(unset)') or 'on'}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ] or ["the command"]


def stage_output(argv: list[str]) -> str | None:
    """The folder a stage writes (its --out)."""
    return argv[argv.index("--out") + 1] if "--out" in argv[:-1] else None


def upstream_runs(state: dict, name: str, argv: list[str]) -> dict[str, float | None]:
    """The recorded stages whose output folder this stage's command reads (a path in its argv, or
    inside one), each with when it last finished. The dependencies come from the commands themselves."""
    runs = {}
    for other, rec in state["stages"].items():
        out = stage_output(rec["argv"])
        if other != name and out is not None and any(a == out or a.startswith(out + "/") for a in argv):
            runs[other] = rec.get("ran", 0.0) if rec["status"] == "done" else None  # 0.0: recorded before `ran`
    return runs


def stale_inputs(state: dict, name: str, argv: list[str], run_dir: Path) -> list[str]:
    """The upstream stages that finished again (or are unfinished now) since `name` ran on their
    output, and the user's input files that changed since. A record from before these were
    recorded is taken as it is."""
    done = state["stages"].get(name)
    if not done or "upstream" not in done:
        return []
    now = upstream_runs(state, name, argv)
    stale = [other for other in now if now[other] is None or done["upstream"].get(other) != now[other]]
    files = input_files(argv, run_dir)
    if "files" in done:
        stale += [path for path, seen in files.items() if done["files"].get(path) != seen]
    return stale


def input_files(argv: list[str], run_dir: Path) -> dict[str, list]:
    """The files a command names outside the run folder (the user's prompts, an HF target folder),
    each as [size, mtime_ns]; a folder as its files', one level deep. An edit in place shows."""
    inside = Path(run_dir).resolve()
    seen = {}
    for arg in argv:
        path = Path(arg.split(",")[0]) if not arg.startswith("-") else None
        if path is None or not path.exists() or path.resolve().is_relative_to(inside):
            continue
        for file in sorted(path.iterdir()) if path.is_dir() else [path]:
            if file.is_file():
                st = file.stat()
                seen[str(file)] = [st.st_size, st.st_mtime_ns]
    return seen


def check_planned(stages: Sequence["PlannedStage"]) -> None:
    """Parse every planned stage's command with its subcommand's own parser before anything runs: a
    recipe value it refuses (`train.lr=abc`, `bench.mode=trie`) once surfaced minutes into a run,
    when its stage began. Commands holding a value known only once an earlier stage ran (`<...>`)
    are left to their stage."""
    parser = build_parser()
    for stage in stages:
        if any(arg.startswith("<") for arg in stage.argv):
            continue
        said = io.StringIO()
        hint = (
            f"fix the recipe key or override of that stage ({shlex.join(['eaglekit', *stage.argv])}); nothing has run"
        )
        try:
            with contextlib.redirect_stderr(said):
                args = parser.parse_args(stage.argv)
        except SystemExit:
            lines = [line for line in said.getvalue().splitlines() if line.strip()]
            raise EaglekitError(
                f"the recipe's stage {stage.name} would be refused: "
                f"{lines[-1] if lines else 'its command does not parse'}",
                hint=hint,
            ) from None
        try:
            check_stage_options(stage.argv, args)
        except (
            EaglekitError
        ) as err:  # a value out of range (`train.batch-tokens=-5`) once failed only when its stage ran
            raise EaglekitError(f"the recipe's stage {stage.name} would be refused: {err.message}", hint=hint) from None


# Each stage's options class (`eaglekit.options`): its checks are the ones the stage runs on its flags.
STAGE_OPTIONS = {
    ("train",): "eaglekit.train.config:TrainConfig",
    ("generate",): "eaglekit.data.options:GenerateOptions",
    ("bench",): "eaglekit.bench.options:BenchOptions",
    ("doctor",): "eaglekit.doctor.options:DoctorOptions",
    ("features",): "eaglekit.features.options:FeaturesOptions",
    ("export",): "eaglekit.formats.options:ExportOptions",
    ("prompts", "build"): "eaglekit.data.options:PromptsBuildOptions",
    ("prompts", "synthesize"): "eaglekit.data.options:SynthesizeOptions",
    ("target", "prepare"): "eaglekit.targets.options:TargetPrepareOptions",
}


def check_stage_options(argv: list[str], args) -> None:
    """Build the stage's options from its parsed flags, running the checks the stage itself runs
    (ranges included: `train.batch-tokens=-5`, `generate.max-new-tokens=0`)."""
    path = STAGE_OPTIONS.get(tuple(argv[:2])) or STAGE_OPTIONS.get(tuple(argv[:1]))
    if path is None:
        return
    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    # Every field is a flag of the stage's parser (a field without one would be a TypeError here: a bug,
    # not a check to skip).
    cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)})


def overwrites(argv: list[str]) -> bool:
    """Whether the stage's subcommand takes --overwrite (doctor rewrites its folder anyway)."""
    return "--overwrite" in subcommand_flags(tuple(argv[:2]))


@functools.lru_cache(maxsize=None)
def subcommand_flags(words: tuple[str, ...]) -> frozenset[str]:
    """The flags of `eaglekit WORDS...` (a subcommand and, where it has them, its own subcommand), from the parser."""
    parser = build_parser()
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return frozenset(flag for action in parser._actions for flag in action.option_strings)


def until_stop(stages: list[PlannedStage], stop_before: str | None) -> list[PlannedStage]:
    """The stages before `stop_before` (`scaling` stops before every scaling-* stage)."""
    for i, s in enumerate(stages):
        if stop_before and (s.name == stop_before or s.name.startswith(f"{stop_before}-")):
            return stages[:i]
    return stages


# ---- the run's time left --------------------------------------------------------------------------


def run_time_left(stages: Sequence[tuple[str, StageTime | None]], unplanned: str | None = None) -> TimeLeft:
    """The stages still to run (name, known time or None), the running one first; `unplanned`: the
    stages the plan cannot name yet, in words (their time is not known either)."""
    known = [t for _, t in stages if t is not None]
    unknown = tuple(name for name, t in stages if t is None) + ((unplanned,) if unplanned else ())
    return TimeLeft(sum(t.seconds for t in known), any(t.floor for t in known), unknown)


def known_stage_time(stage: PlannedStage | None, state: dict, out: Path) -> StageTime | None:
    """What a stage that has not reported progress will take, where something says it: its own time
    budget (train's --time-budget-s), or a stage like it that ran (a scaling slice's training: the main
    draft's seconds a step times its steps; a slice's bench: the main bench's seconds). Else None."""
    if stage is None:
        return None
    budget = flag_value(stage.argv, "--time-budget-s")
    if budget is not None:
        return StageTime(budget, floor=True)
    if stage.name.startswith("scaling-") and stage.name.endswith("-train"):
        steps = flag_value(stage.argv, "--max-steps")
        per_step = main_draft_step_seconds(state, out)
        return StageTime(per_step * steps) if steps is not None and per_step is not None else None
    if stage.name.startswith("scaling-") and stage.name.endswith("-bench"):
        return measured_stage_time(state, "bench")
    return None


def flag_value(argv: list[str], flag: str) -> float | None:
    """The number after `flag` in a stage's command line, None without it (or not a number: the
    stage's own parser says so when it runs)."""
    if flag not in argv[:-1]:
        return None
    try:
        return float(argv[argv.index(flag) + 1])
    except ValueError:
        return None


def measured_stage_time(state: dict, name: str) -> StageTime | None:
    """A finished stage's seconds, where they measured it whole (not only the part after a resume)."""
    done = state["stages"].get(name) or {}
    if done.get("status") != "done" or done.get("resumed"):
        return None
    return StageTime(float(done["seconds"]))


def main_draft_step_seconds(state: dict, out: Path) -> float | None:
    """Seconds an optimizer step of the main draft's training took, start-up included (None: not measured)."""
    train = measured_stage_time(state, "train")
    steps = steps_done(read_draft_manifest(out / RUN_DRAFT)) if train is not None else None
    return train.seconds / steps if steps else None


STAGES = (
    "target",
    "prompts",
    "synthesize",
    "generate",
    "features",
    "val-prompts",
    "val-generate",
    "val-features",
    "train",
    "export-sglang",
    "export-vllm",
    "export-eagle",
    "doctor",
    "bench",
    "scaling",
)


def release_device_memory() -> None:
    """After an in-process stage: its compiled steps hold their engine (and a KV cache of tens of GB
    at generation's batch) alive through torch.compile's caches; the next stage gets the GPU back."""
    import torch  # only here: this module imports no torch, so `eaglekit run --plan` stays light

    if not torch.cuda.is_available():
        return
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


class StopBefore(Exception):
    """`--stop-before STAGE` reached: the stages before it are done."""


def command_line(argv: list[str], processes: int = 1) -> list[str]:
    """The command a stage runs: `eaglekit <argv>`, or torchrun with `processes` workers on this host."""
    if processes <= 1:
        return ["eaglekit", *argv]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        "-m",
        "eaglekit",
        *argv,
    ]


def run_stage(argv: list[str], processes: int = 1) -> tuple[int, str | None]:
    """(exit code, what crashed) of `eaglekit <argv>`: an argparse exit or an exception that is not an
    EaglekitError (a bug, or an input nothing checked) ends the stage as failed, not the run as
    "running" forever."""
    try:
        return run_eaglekit(argv, processes), None
    except SystemExit as stop:  # argparse: a recipe value its stage does not take
        return (stop.code if isinstance(stop.code, int) else 2), "its options were refused (above)"
    except Exception as err:  # noqa: BLE001 - recorded, logged whole, and raised as the run's error
        log.exception("stage crashed")
        return 1, f"{type(err).__name__}: {err}"


def run_eaglekit(argv: list[str], processes: int = 1) -> int:
    """`eaglekit <argv>` in this process, or under torchrun with `processes` workers on this host."""
    if processes <= 1:
        return main(argv)
    cmd = command_line(argv, processes)
    log.info("torchrun: %s", shlex.join(cmd))
    return subprocess.run(cmd).returncode


def prompt_stages(pipe: "Pipeline", recipe: dict, out: Path, t: list[str], dev: list[str]) -> None:
    """prompts/: built from the recipe's sources, topped up with `synthesize.add` Magpie prompts of the
    target (its own kind of questions, for domains the files miss); without sources, Magpie alone."""
    prompts = dict(recipe.get("prompts") or {})
    synth = dict(recipe.get("synthesize") or {})
    add = int(synth.pop("add", 0) or 0)
    if not prompts.get("source"):  # Magpie alone: prompts.num-prompts, else synthesize.add
        if add and "num-prompts" not in prompts:
            prompts["num-prompts"] = add
        pipe.stage(
            "prompts",
            [
                "prompts",
                "synthesize",
                *t,
                *to_flags(prompts),
                *to_flags(synth),
                *dev,
                "--out",
                str(out / "prompts"),
                "--overwrite",
            ],
        )
        return
    if add <= 0:
        pipe.stage("prompts", ["prompts", "build", *to_flags(prompts), "--out", str(out / "prompts"), "--overwrite"])
        return
    built = out / "prompts-files"
    pipe.stage("prompts", ["prompts", "build", *to_flags(prompts), "--out", str(built), "--overwrite"])
    if pipe.plan is not None:  # the files are not read yet
        wanted = f"<prompts in {built} + {add}>"
    else:
        wanted = str(
            add
            + sum(read_json(built / MANIFEST, "prompts manifest")["counts"].get(k, 0) for k in ("train", "validation"))
        )
    pipe.stage(
        "synthesize",
        [
            "prompts",
            "synthesize",
            *t,
            "--top-up",
            str(built),
            "--num-prompts",
            wanted,
            *to_flags(synth),
            *dev,
            "--out",
            str(out / "prompts"),
            "--overwrite",
        ],
    )


def generate_flags(recipe: dict) -> list[str]:
    """The generate section's flags; with `gpus: N` on CUDA and no devices given, one worker per GPU
    (the vllm and openai backends spread the work over GPUs themselves)."""
    section = dict(recipe.get("generate") or {})
    warn_past_training(recipe)
    gpus = int(recipe.get("gpus") or 1)
    if (
        gpus > 1
        and "devices" not in section
        and str(recipe.get("device", "")).startswith("cuda")
        and section.get("backend", GenerateOptions.backend) in LOCAL_BACKENDS
    ):
        section["devices"] = ",".join(f"cuda:{i}" for i in range(gpus))
    return to_flags(section)


def warn_past_training(recipe: dict) -> None:
    """Say so when generation may write conversations longer than training reads: the stage that
    tokenizes for training (features offline, train online with `features: false`) keeps the first
    `max-length` tokens of each, so answer tokens past it cost generation time and are never trained on."""
    generate = recipe.get("generate") or {}
    online = recipe.get("features", {}) is False
    stage, default = ("train", TrainConfig.max_length) if online else ("features", FeaturesOptions.max_length)
    longest = max(int(generate.get(k) or 0) for k in ("context-length", "cache-slots"))
    max_length = int((recipe.get(stage) or {}).get("max-length") or default)
    if longest > max_length:
        log.warning(
            "generate may write conversations of %d tokens, training reads the first %d of each "
            "(%s.max-length): set generate.context-length to %d unless the answers serve "
            "something else too",
            longest,
            max_length,
            stage,
            max_length,
        )


def feature_stage(
    pipe: "Pipeline", name: str, t: list[str], dev: list[str], features: dict, data: Path, dest: Path
) -> list[str]:
    pipe.stage(name, ["features", *t, "--data", str(data), *to_flags(features), *dev, "--out", str(dest)])
    return ["--features", str(dest)]


def validation_stages(pipe: "Pipeline", recipe: dict, out: Path, t: list[str], dev: list[str], features) -> list[str]:
    """`validation: {source: FILE}`: held-out prompts of the workload the draft will serve (say
    MT-bench), answered by the target, become training's validation set, so the accept length
    training predicts and selects on is measured where the draft will run (a held-out share of the
    training mix predicted 2.63 where vLLM measured 1.65 on MT-bench writing prompts). Without it,
    training holds out a share of the training conversations."""
    val = dict(recipe.get("validation") or {})
    if not val.get("source"):
        return []
    pipe.stage(
        "val-prompts",
        [
            "prompts",
            "build",
            *to_flags(val),
            "--validation-fraction",
            "0",
            "--out",
            str(out / "val-prompts"),
            "--overwrite",
        ],
    )
    pipe.stage(
        "val-generate",
        [
            "generate",
            "--prompts",
            str(out / "val-prompts"),
            *t,
            *generate_flags(recipe),
            *dev,
            "--out",
            str(out / "val-conversations"),
        ],
    )
    if features is False:
        return ["--val-data", str(out / "val-conversations")]
    feature_stage(pipe, "val-features", t, dev, features, out / "val-conversations", out / "val-features")
    return ["--val-data", str(out / "val-features")]


def run_pipeline(recipe: dict, out: str | Path | None = None, stop_before: str | None = None) -> dict:
    """Run every stage of `recipe` into `out` (default runs/<recipe name>), or the stages before
    `stop_before`. Returns pipeline.json's content."""
    if stop_before and stop_before not in STAGES and not stop_before.startswith("export-"):
        raise EaglekitError(f"there is no stage named {stop_before!r}", hint=f"stages: {', '.join(STAGES)}")
    out = Path(out or recipe.get("out") or Path("runs") / recipe.get("name", "run"))
    with writer_lock(out, stage="run"):  # two `eaglekit run` into one folder would run every stage twice
        return run_locked(recipe, out, stop_before)


def plan_pipeline(recipe: dict, out: str | Path | None = None) -> list[str]:
    """The command line of every stage of `recipe`, in order, running none (`eaglekit run --plan`)."""
    out = Path(out or recipe.get("out") or Path("runs") / recipe.get("name", "run"))
    check_doctor_export(recipe)
    pipe = Pipeline(recipe, out, plan=[])
    try:
        run_stages(pipe, recipe, out)
    except StepsNotKnownYet as err:  # the rest of the plan is known: print it, and say what is not
        check_planned(pipe.plan)
        return [stage.command() for stage in pipe.plan] + [f"# then the scaling slices: {err.message}; {err.hint}"]
    check_planned(pipe.plan)
    return [stage.command() for stage in pipe.plan]


def planned_stages(recipe: dict, out: Path) -> list[str] | None:
    """The names of the stages `recipe` runs, in order; None where the plan needs an earlier stage's
    output (the scaling slices' step budget comes from the main draft)."""
    stages, whole = plan_so_far(recipe, out)
    return [stage.name for stage in stages] if whole else None


def planned(recipe: dict, out: Path) -> list[PlannedStage]:
    """Every stage of `recipe`, in order, running none."""
    pipe = Pipeline(recipe, out, plan=[])
    run_stages(pipe, recipe, out)
    return pipe.plan


def plan_so_far(recipe: dict, out: Path) -> tuple[list[PlannedStage], bool]:
    """The stages of `recipe` that can be planned now, and whether that is all of them (False where
    a stage's plan needs an earlier stage's output: the scaling slices' steps come from the main draft)."""
    pipe = Pipeline(recipe, out, plan=[])
    try:
        run_stages(pipe, recipe, out)
    except (EaglekitError, OSError):
        return pipe.plan, False
    return pipe.plan, True


def check_doctor_export(recipe: dict) -> None:
    """The doctor reads the export of its engine's format: refuse a recipe whose export stages do not
    write it (`export.formats=[sglang]` with the default vLLM doctor), before anything runs."""
    formats = list((recipe.get("export") or {}).get("formats") or FORMATS)
    engine = (recipe.get("doctor") or {}).get("engine", "vllm")
    if engine in FORMATS and engine not in formats:  # it read a folder no stage writes, and failed at the end
        raise EaglekitError(
            f"the doctor reads the {engine} export (doctor.engine: {engine}), which "
            f"export.formats {formats} does not write",
            hint=f"add {engine} to export.formats, or set doctor.engine to one of {formats}",
        )


def check_layout_export(recipe: dict) -> None:
    """A draft trained with EAGLE-3.1's norms (`train.fc-norm` ...) cannot be written for an engine
    whose code has none (EAGLE's): refuse such a recipe before anything runs, not at its export stage."""
    train = recipe.get("train") or {}
    layout = [key.replace("_", "-") for key in LAYOUT_KEYS if train.get(key.replace("_", "-"))]
    formats = list((recipe.get("export") or {}).get("formats") or FORMATS)
    lacking = [f for f in formats if f in FORMATS and not FORMATS[f].holds_layout]
    if layout and lacking:
        raise EaglekitError(
            f"train.{', train.'.join(layout)} trains EAGLE-3.1's norms, which the {', '.join(lacking)} "
            f"export cannot hold (its engine's code has none)",
            hint=f"export.formats={[f for f in formats if f not in lacking]}, or drop the norm flags from train",
        )


def run_locked(recipe: dict, out: Path, stop_before: str | None) -> dict:
    pipe = Pipeline(recipe, out, stop_before)
    check_doctor_export(recipe)
    check_layout_export(recipe)
    pipe.whole_plan, pipe.plan_is_whole = plan_so_far(recipe, out)
    check_planned(pipe.whole_plan)
    for stage in until_stop(pipe.whole_plan, stop_before):  # a stage folder of the user's is refused now, not hours in
        if (folder := stage_output(stage.argv)) is not None:
            settle_folder(folder, "target prepare" if stage.argv[:2] == ["target", "prepare"] else stage.argv[0])
    try:
        run_stages(pipe, recipe, out)
    except StopBefore as stop:
        pipe.state["stopped_before"], pipe.state["doctor_ok"] = str(stop), None
        pipe.state["summary"] = f"stopped before stage {stop}; rerun without --stop-before to go on"
        write_json(pipe.state_path, pipe.state)
        write_report(out)
        return pipe.state
    except EaglekitError:
        report_after_failure(out)
        raise
    pipe.state.pop("stopped_before", None)
    pipe.state["doctor_ok"], pipe.state["summary"] = summarize(out)
    pipe.state["summary"] += "".join(
        f"\n{line}" for line in (scaling_summary(out), f"report: {out / 'report.html'}") if line
    )
    write_json(pipe.state_path, pipe.state)
    write_report(out)
    return pipe.state


def report_after_failure(out: Path) -> None:
    """The report of a failed run (the failed stage marked failed); its own error must not hide the stage's."""
    if not (out / STATE).is_file():  # refused before any stage ran: nothing to report
        return
    try:
        log.info("report of the run so far: %s", write_report(out))
    except EaglekitError as err:
        log.error("could not write the report of %s: %s", out, err)


def run_stages(pipe: Pipeline, recipe: dict, out: Path) -> None:
    """Every stage in order (each skipped if it finished earlier with the same command)."""
    scaling = scaling_plan(recipe)  # checked before the first stage runs
    device = recipe.get("device")
    dev = ["--device", str(device)] if device else []

    target = out / "target"
    if recipe.get("prepare", True) is False:  # the target folder as is (a large target is never loaded here)
        target = Path(str(recipe["target"]))
    else:
        pipe.stage(
            "target",
            [
                "target",
                "prepare",
                "--target",
                str(recipe.get("target", DEFAULT_TARGET)),
                "--out",
                str(target),
                "--overwrite",
            ],
        )
    t = ["--target", str(target)]

    prompt_stages(pipe, recipe, out, t, dev)

    pipe.stage(
        "generate",
        [
            "generate",
            "--prompts",
            str(out / "prompts"),
            *t,
            *generate_flags(recipe),
            *dev,
            "--out",
            str(out / "conversations"),
        ],
    )

    # Offline features by default: captured once, every epoch after that costs only the draft.
    features = recipe.get("features", {})
    train_input = (
        ["--data", str(out / "conversations")]
        if features is False
        else feature_stage(pipe, "features", t, dev, features, out / "conversations", out / "features")
    )
    train_input += validation_stages(pipe, recipe, out, t, dev, features)
    draft = out / RUN_DRAFT
    pipe.stage(
        "train",
        ["train", *t, *train_input, *to_flags(recipe.get("train")), *dev, "--out", str(draft)],
        resume_flag="--resume",
        resume_marker=draft / TRAINER_STATE,
        processes=int(recipe.get("gpus") or 1),
    )

    export = dict(recipe.get("export") or {})
    formats = export.pop("formats", list(FORMATS))  # every format the export writes
    for fmt in formats:
        pipe.stage(
            f"export-{fmt}",
            [
                "export",
                str(draft),
                "--format",
                fmt,
                *t,
                *to_flags(export),
                "--out",
                str(out / RUN_EXPORT / fmt),
                "--overwrite",
            ],
        )

    doctor = dict(recipe.get("doctor") or {})
    engine = doctor.pop("engine", "vllm")
    doctor_dev = [] if "device" in doctor else dev  # the probe runs where the other stages do
    pipe.stage(
        "doctor",
        [
            "doctor",
            str(out / RUN_EXPORT / engine),
            *t,
            "--engine",
            engine,
            *to_flags(doctor),
            *doctor_dev,
            "--out",
            str(out / RUN_DOCTOR),
        ],
        ok_codes=(0, 1),
    )

    bench = recipe.get("bench")
    if bench:
        pipe.stage(
            "bench",
            ["bench", *t, "--draft", str(draft), *to_flags(bench), *dev, "--out", str(out / RUN_BENCH), "--overwrite"],
        )

    if scaling is not None:
        if pipe.stop_before == "scaling":
            raise StopBefore("scaling")
        run_scaling(pipe, scaling, recipe, out, t, dev, train_input)


def data_line(manifest: dict, acc0: float | None) -> str | None:
    """What the draft learned from, beside what a bigram table of the same data predicts (the
    validation baseline): a draft no better than that has too little data to learn more."""
    counts = manifest.get("counts") or {}
    tokens, steps = counts.get("train_assistant_tokens"), steps_done(manifest) or "?"
    bigram = (counts.get("val_baselines") or {}).get("bigram_acc")
    if tokens is None:
        return None
    text = f"data: the draft learned from {tokens:,} answer tokens in {steps} steps"
    if acc0 is not None and bigram is not None:
        text += f"; step-0 accuracy {acc0:.3f} against {bigram:.3f} for a bigram table of the same data"
        if acc0 <= 1.05 * bigram:  # within 5 %: what a table of next tokens knows, nothing more
            text += " (no better than which token follows which: it needs more answers to learn from)"
    return text


def summarize(out: Path) -> tuple[bool, str]:
    """One paragraph: what training predicts, what the doctor found, what the bench measured."""
    draft, doctor, bench = out / RUN_DRAFT, out / RUN_DOCTOR / DOCTOR_REPORT, out / RUN_BENCH / BENCH_RESULTS
    manifest = read_json(draft_manifest_path(draft), "draft manifest")
    best = manifest.get("best") or {}
    report = read_json(doctor, "doctor report")
    failed = [c["id"] for c in report["checks"] if c["status"] == "fail"]
    probe = report.get("probe") or {}
    acc0 = (best.get("acc") or [None])[0]
    # the prediction for the bench's chain, else the default chain's (a walk of 7 against a chain of 5 is
    # not like with like; a chain's walk predicts no tree)
    spec = ((read_json(bench, "bench results").get("config") or {}).get("spec") or {}) if bench.is_file() else {}
    k = spec["k"] if spec.get("mode") == "chain" else SpecConfig.k
    lines = [
        f"draft: {draft} ({prediction_text(manifest, k)}; step-0 accuracy {acc0 if acc0 is None else round(acc0, 3)})",
        f"doctor: {'ok' if report['ok'] else 'FAILED ' + ', '.join(failed)}; live probe tau {probe.get('tau')}"
        f" ({doctor})",
    ]
    data = data_line(manifest, acc0)
    if data:
        lines.append(data)
    if made_before(doctor, draft_manifest_path(draft)):
        lines[1] = f"doctor: {doctor} predates this draft (not run again since it was trained): run the doctor stage"
    if made_before(bench, draft_manifest_path(draft)):
        lines.append(
            f"bench: {bench} predates this draft (not run again since it was trained): its figures are "
            "an earlier draft's; run the bench stage"
        )
    elif bench.is_file():
        summary = read_json(bench, "bench results")["summary"]
        lines.append(
            f"bench: tau {summary['tau']}, speedup {summary['speedup']}x over plain decoding "
            f"({summary['spec']}, {bench.with_name('report.md')})"
        )
        if summary.get("throughout"):  # the draft's own tau, which the fallback's run does not count
            t = summary["throughout"]
            lines.append(f"bench speculating throughout: tau {t['tau']}, speedup {t['speedup']}x")
        warning = (summary.get("timing") or {}).get("warning")
        if warning:  # the bench's own doubt about the figures above
            lines.append(f"bench warning: {warning}")
        if summary.get("verdict") and summary["speedup"] < 1:
            lines.append(summary["verdict"])
            if str(summary.get("device", "")).startswith("cpu"):
                lines.append(
                    "On a CPU every verified token is real compute; a draft that pays comes from more data "
                    "and steps on a GPU: `eaglekit run --recipe smollm2-h200 'prompts.source=[FILES]'` "
                    "(the recipe for one H200)."
                )
    return bool(report["ok"]), "\n".join(lines)
