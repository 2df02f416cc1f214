"""The data-scaling curve of `eaglekit run`: is the draft data-limited?

A recipe with `scaling: {fractions: [0.125, 0.25, 0.5, 1.0]}` trains, after the main draft, one
more draft per fraction on a growing slice of the same training samples, each under the same step
budget, and measures each one:

    runs/<name>/scaling/
      frac-0.125/draft/   `eaglekit train --train-fraction 0.125 --max-steps N` (a full training run folder)
      frac-0.125/bench/   `eaglekit bench` of that draft (when the recipe benches and scaling.bench is on)
      ...
      scaling.json        one row per slice: samples, answer tokens, steps, best walk / simulated tau,
                          step-0 accuracy, bench tau and speedup
      scaling.md          the same as a table
      scaling.svg         tau and step-0 accuracy against the slice's answer tokens

The slices are hash-stable and nested (train's `--train-fraction`: a sample is in a share when a
salted hash of its id falls below it, so the 1/8 slice lies inside the 1/4 slice, and adding data
never reshuffles them). Every slice validates on the same held-out set as the main draft and gets
the same N optimizer steps (`scaling.steps`, default: the steps the main draft/ run took), so the
slices differ only in how much distinct data they saw: a curve still rising at the full data says
more data would pay. The share 1.0 is the main draft itself when that draft ran exactly N steps
planned as N from its start (`train.max-steps` N, no time budget): the same command but for its
folder, so it is not trained twice (`main_is_full_slice`). Each slice is a pipeline stage of its
own (`scaling-<f>-train`, `scaling-<f>-bench`): finished slices are skipped on a rerun and an
interrupted one resumes.

Recipe keys (section `scaling`):
    fractions   at least two increasing shares in (0, 1], e.g. [0.125, 0.25, 0.5, 1.0]
    steps       optimizer steps of every slice (default: those of the main draft)
    bench       bench every slice's draft with the recipe's bench section (default: true)
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from eaglekit.artifacts import (
    BENCH_RESULTS,
    RUN_BENCH,
    RUN_DRAFT,
    RUN_SCALING,
    SCALING_SUMMARY,
    TRAIN_LOG,
    TRAINER_STATE,
    atomic_path,
    read_json,
    write_json,
)
from eaglekit.errors import EaglekitError
from eaglekit.pipeline.recipe import to_flags
from eaglekit.report.collect import read_log
from eaglekit.report.scaling import scaling_svg
from eaglekit.train.manifest import draft_manifest_path, read_draft_manifest, steps_done

KEYS = ("fractions", "steps", "bench")
# Train flags that set the length of a run: every slice gets the same number of steps instead.
LENGTH_FLAGS = ("epochs", "max-steps", "time-budget-s")
PASSES = "steps done over the slice's steps per epoch: how often training saw each sample"


class StepsNotKnownYet(EaglekitError):
    """The slices' step budget is the main draft's, which has not run yet (a plan made before it)."""


@dataclass(frozen=True)
class ScalingPlan:
    fractions: tuple[float, ...]
    steps: int | None
    bench: bool


def scaling_plan(recipe: dict) -> ScalingPlan | None:
    """The recipe's `scaling` section, checked; None without one.

    Raises:
        EaglekitError: unknown keys, fewer than two fractions, fractions outside (0, 1] or not
            increasing, a bad step count, or train keys the slices cannot honour.
    """
    section = recipe.get("scaling")
    if section is None or section is False:
        return None
    hint = "e.g. scaling: {fractions: [0.125, 0.25, 0.5, 1.0]}"
    if not isinstance(section, dict):
        raise EaglekitError(f"recipe scaling must be a section, got {section!r}", hint=hint)
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise EaglekitError(f"recipe scaling has unknown keys {unknown}", hint=f"keys are {', '.join(KEYS)}")
    fractions = section.get("fractions")
    if (
        not isinstance(fractions, list)
        or len(fractions) < 2
        or not all(isinstance(f, (int, float)) and not isinstance(f, bool) for f in fractions)
    ):
        raise EaglekitError(f"scaling.fractions must list at least two numbers, got {fractions!r}", hint=hint)
    if not all(0 < f <= 1 for f in fractions) or any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise EaglekitError(f"scaling.fractions must increase within (0, 1], got {fractions}", hint=hint)
    steps = section.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise EaglekitError(
            f"scaling.steps must be a whole number >= 1, got {steps!r}",
            hint="or leave it out: every slice then gets the main draft's steps",
        )
    bench = section.get("bench", True)
    if not isinstance(bench, bool):
        raise EaglekitError(f"scaling.bench must be true or false, got {bench!r}", hint="e.g. scaling.bench=false")
    train = recipe.get("train") or {}
    if train.get("init-from"):
        raise EaglekitError(
            "scaling with train.init-from would measure fine-tuning a trained draft, not the data",
            hint="drop train.init-from or the scaling section",
        )
    if "train-fraction" in train:
        raise EaglekitError("train.train-fraction is set by the scaling slices", hint="drop it from the train section")
    return ScalingPlan(tuple(float(f) for f in fractions), steps, bench)


def slice_folder(out: Path, fraction: float) -> Path:
    return out / RUN_SCALING / f"frac-{fraction:g}"


def step_budget(plan: ScalingPlan, out: Path) -> int:
    if plan.steps is not None:
        return plan.steps
    manifest = read_draft_manifest(out / RUN_DRAFT)
    if manifest is None:
        raise StepsNotKnownYet(
            f"the scaling slices run the main draft's steps, and {draft_manifest_path(out / RUN_DRAFT)} "
            "does not exist yet",
            hint="set scaling.steps to plan the slices before the main draft is trained",
        )
    steps = steps_done(manifest)
    if not steps:
        raise EaglekitError(
            "the main draft ran 0 steps: no step budget for the scaling slices", hint="set scaling.steps"
        )
    return int(steps)


def run_scaling(
    pipe, plan: ScalingPlan, recipe: dict, out: Path, t: list[str], dev: list[str], train_input: list[str]
) -> None:
    """Train (and bench) every slice as its own stage, then write the summary files."""
    steps = step_budget(plan, out)
    train = {k: v for k, v in (recipe.get("train") or {}).items() if k not in LENGTH_FLAGS}
    bench = recipe.get("bench") if plan.bench else None
    for fraction in plan.fractions:
        if reuses_main(out, fraction, steps):
            continue
        folder = slice_folder(out, fraction)
        draft = folder / RUN_DRAFT
        pipe.stage(
            f"scaling-{fraction:g}-train",
            [
                "train",
                *t,
                *train_input,
                *to_flags(train),
                "--train-fraction",
                f"{fraction:g}",
                "--max-steps",
                str(steps),
                *dev,
                "--out",
                str(draft),
            ],
            resume_flag="--resume",
            resume_marker=draft / TRAINER_STATE,
            processes=int(recipe.get("gpus") or 1),
        )
        if bench:
            pipe.stage(
                f"scaling-{fraction:g}-bench",
                [
                    "bench",
                    *t,
                    "--draft",
                    str(draft),
                    *to_flags(bench),
                    *dev,
                    "--out",
                    str(folder / RUN_BENCH),
                    "--overwrite",
                ],
            )
    if pipe.plan is None:  # a plan-only pass (`--plan`, the run's look ahead) has no results to summarize
        write_summary(out, plan, steps, pipe.state)


def main_is_full_slice(manifest: dict, steps: int) -> bool:
    """Whether a main draft's manifest is what the share-1.0 slice would train: complete, all the
    data, and N steps planned as N from the first step (a time budget re-plans the learning-rate
    schedule as it goes, so a budgeted run is not the same run even when it ends at N)."""
    config = manifest.get("config") or {}
    done = steps_done(manifest)
    return (
        bool(manifest.get("complete"))
        and config.get("train_fraction", 1.0) == 1.0
        and config.get("max_steps") == steps == done
        and config.get("time_budget_s") is None
    )


def reuses_main(out: Path, fraction: float, steps: int) -> bool:
    manifest = read_draft_manifest(out / RUN_DRAFT) if fraction == 1.0 else None
    return manifest is not None and main_is_full_slice(manifest, steps)


def slice_row(out: Path, fraction: float, steps: int, state: dict) -> dict:
    """One slice as measured: its training manifest's best validation and, if benched, the bench tau
    (for a share 1.0 that is the main draft, the main draft's and the main bench's)."""
    main = reuses_main(out, fraction, steps)
    folder = out if main else slice_folder(out, fraction)
    entry = state["stages"].get("train" if main else f"scaling-{fraction:g}-train") or {}
    row = {
        "fraction": fraction,
        "folder": str(folder),
        "status": entry.get("status", "not run"),
        "command": shlex.join(["eaglekit", *entry["argv"]]) if entry else None,
        "steps": steps,
        "main_draft": main,
    }
    m = read_draft_manifest(folder / RUN_DRAFT, "slice draft manifest")
    if m is not None:
        best, counts = m.get("best") or {}, m.get("counts") or {}
        done, per_epoch = steps_done(m), (m.get("steps") or {}).get("per_epoch")
        row.update(
            samples=counts.get("train_samples"),
            tokens=counts.get("train_assistant_tokens"),
            all_tokens=counts.get("train_tokens"),
            steps=done,
            passes=round(done / per_epoch, 2) if done is not None and per_epoch else None,
            best_step=best.get("step"),
            walk_tau=best.get("walk_accept_length"),
            sim_tau=best.get("sim_accept_length"),
            acc0=(best.get("acc") or [None])[0],
            train_acc0=train_acc0(folder / RUN_DRAFT / TRAIN_LOG),
            device=m.get("config", {}).get("device"),
            date=m.get("created"),
        )
        if not m.get("complete") and row["status"] == "done":
            row["status"] = "running"
    results = folder / RUN_BENCH / BENCH_RESULTS
    if results.is_file():
        s = read_json(results, "slice bench results")["summary"]
        # the draft's own tau (speculating throughout) where the bench ran it: the fallback's tau reads high
        row.update(bench_tau=(s.get("throughout") or s)["tau"], speedup=s["speedup"], bench_spec=s["spec"])
    row["status"] = {"running": "unfinished", "done": "done", "not run": "not run"}.get(row["status"], "failed")
    return row


def train_acc0(log: Path, last: int = 10) -> float | None:
    """Step-0 accuracy on the training batches, the mean of the last `last` logged steps: beside the
    validation accuracy it says whether a small share is being memorized. The log is read as the
    report reads it (a torn last line is left out, any other bad line is an error)."""
    if not log.is_file():
        return None
    accs = [event["acc"][0] for event in read_log(log)[0] if event.get("acc")]
    return round(sum(accs[-last:]) / len(accs[-last:]), 5) if accs else None


def overfits(row: dict, margin: float = 0.02) -> bool:
    """Training accuracy above validation accuracy by more than `margin`: the share is memorized."""
    return None not in (row.get("train_acc0"), row.get("acc0")) and row["train_acc0"] > row["acc0"] + margin


def verdict(rows: list[dict], key: str = "walk_tau", step: float = 0.05) -> str | None:
    """One sentence on the last two finished points (the largest slices)."""
    done = [r for r in rows if r["status"] == "done" and r.get(key) is not None]
    if len(done) < 2:
        return None
    a, b, first = done[-2], done[-1], done[0]
    gain = b[key] - a[key]
    if gain > step:
        reading = "still rising: more data of this kind should pay"
    elif abs(b[key] - first[key]) <= step and first.get("passes"):
        # The smallest share, repeated, did as well as all the data: the step budget binds, not the data.
        reading = (
            f"flat within {step} from the {first['fraction']:g} share on, which training saw "
            f"{first['passes']:g} times: at {b['steps']} steps the draft is limited by its steps, not "
            "by its data (raise scaling.steps to ask again for a longer run)"
        )
    else:
        reading = f"flat within {step}: at this step budget more data of this kind buys little"
    said = (
        f"{key.replace('_', ' ')} {a[key]:.3f} -> {b[key]:.3f} ({gain:+.3f}) from {a['fraction']:g} to "
        f"{b['fraction']:g} of the data, {b['steps']} steps each: {reading}"
    )
    memorized = [r for r in done[:-1] if overfits(r)]
    if memorized and not overfits(b):
        r = memorized[0]
        said += (
            f"; the {r['fraction']:g} share overfits (training step-0 accuracy {r['train_acc0']:.3f} "
            f"against {r['acc0']:.3f} held out), all of the data does not"
        )
    return said


def write_summary(out: Path, plan: ScalingPlan, steps: int, state: dict) -> dict:
    """scaling.json, scaling.md and scaling.svg from the slices' own outputs."""
    rows = [slice_row(out, f, steps, state) for f in plan.fractions]
    first = next((r for r in rows if r.get("date")), {})
    table = {
        "fractions": list(plan.fractions),
        "steps": steps,
        "rows": rows,
        "verdict": verdict(rows),
        "tokens": "answer (assistant) tokens of the slice's training samples",
        "passes": PASSES,
        "command": " && ".join(r["command"] for r in rows if r["command"]) or None,
        "device": first.get("device"),
        "date": first.get("date"),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    folder = out / RUN_SCALING
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / SCALING_SUMMARY, table)
    with atomic_path(folder / "scaling.md") as tmp:
        tmp.write_text(markdown(table))
    svg = scaling_svg(table)
    if svg is not None:
        with atomic_path(folder / "scaling.svg") as tmp:
            tmp.write_text(svg)
    return table


def markdown(table: dict) -> str:
    fmt = lambda v: "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [
        f"# Data scaling: {table['steps']} steps per slice",
        "",
        "| fraction | status | samples | answer tokens | passes | best step | walk tau | sim tau | acc_0 | bench tau | speedup |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table["rows"]:
        lines.append(
            f"| {r['fraction']:g} | {r['status']} | {fmt(r.get('samples'))} | {fmt(r.get('tokens'))} | "
            f"{fmt(r.get('passes'))} | "
            f"{fmt(r.get('best_step'))} | {fmt(r.get('walk_tau'))} | {fmt(r.get('sim_tau'))} | "
            f"{fmt(r.get('acc0'))} | {fmt(r.get('bench_tau'))} | {fmt(r.get('speedup'))} |"
        )
    lines += ["", f"passes: {PASSES}."]
    if table.get("verdict"):
        lines += ["", table["verdict"]]
    return "\n".join(lines) + "\n"


def scaling_summary(out: Path) -> str | None:
    """The run summary's line about the curve, if there is one."""
    path = out / RUN_SCALING / SCALING_SUMMARY
    if not path.is_file():
        return None
    table = read_json(path, "scaling summary")
    points = ", ".join(
        f"{r['fraction']:g}: {r['walk_tau'] if r.get('walk_tau') is not None else r.get('sim_tau')}"
        for r in table["rows"]
    )
    return f"scaling: walk tau by share of the data {points} ({path.parent / 'scaling.md'})" + (
        f"\n  {table['verdict']}" if table.get("verdict") else ""
    )
