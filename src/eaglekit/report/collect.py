"""Read what a run folder's stages wrote, for the report: nothing is computed that a stage did not
measure, and what is absent is reported as absent.

Every part of the report is a `Part`: its status (`done`, `unfinished` when the stage was
interrupted or is still running, `failed`, `not run`, `unreadable`), a note saying why, the data
read, and where it came from (files, the exact command, device, date).

Inputs (all optional), under RUN_DIR:
    pipeline.json                  `eaglekit run`'s state: each stage's command and status
    draft/manifest.json, log.jsonl  training: best validation, history, per-step train/val lines
    doctor/report.json, manifest.json
    bench/results.json
    scaling/scaling.json           the data-scaling curve (pipeline/scaling.py)
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from eaglekit.artifacts import (
    BENCH_RESULTS,
    DOCTOR_REPORT,
    MANIFEST,
    PIPELINE_STATE,
    RUN_BENCH,
    RUN_DOCTOR,
    RUN_DRAFT,
    RUN_SCALING,
    SCALING_SUMMARY,
    TRAIN_LOG,
    made_before,
    read_json,
)
from eaglekit.bench.prompts import prompt_categories
from eaglekit.bench.stats import group_stats, grouped
from eaglekit.errors import EaglekitError

STATUS = ("done", "unfinished", "failed", "not run", "unreadable", "missing", "stale")


@dataclass
class Source:
    """Where a figure came from."""

    files: list[str] = field(default_factory=list)
    command: str | None = None
    device: str | None = None
    date: str | None = None


@dataclass
class Part:
    status: str
    note: str = ""
    data: dict = field(default_factory=dict)
    source: Source = field(default_factory=Source)


def read_optional(path: Path, what: str) -> tuple[dict | None, str | None]:
    """(content, None) if the file is there and valid, (None, None) if absent, (None, error) if corrupt."""
    if not path.is_file():
        return None, None
    try:
        return read_json(path, what), None
    except EaglekitError as err:
        return None, err.message


def pipeline_state(run: Path) -> tuple[dict | None, str | None]:
    return read_optional(run / PIPELINE_STATE, "pipeline state")


def stage_status(state: dict | None, name: str) -> tuple[str | None, str, str | None]:
    """(status, note, command) of a stage as `eaglekit run` recorded it; status None if not recorded."""
    entry = ((state or {}).get("stages") or {}).get(name)
    if not entry:
        return None, "", None
    command = shlex.join(["eaglekit", *entry["argv"]])
    status = entry.get("status")
    if status == "done":
        return "done", "", command
    if status == "running":
        return "unfinished", "started but not finished (interrupted, or still running)", command
    return "failed", f"failed with exit {entry.get('exit_code')}", command


def status_of(
    state: dict | None, name: str, manifest: dict | None, *, complete_key: str | None = None
) -> tuple[str, str, str | None]:
    """A part's status: the pipeline's record of the stage, else what the folder holds."""
    status, note, command = stage_status(state, name)
    if status is None:
        if manifest is None:
            return "not run", f"no {name} output in this folder", None
        status, note = "done", "run outside `eaglekit run` (no command recorded)"
    if status == "done" and complete_key and manifest is not None and manifest.get(complete_key) is False:
        status, note = "unfinished", "its manifest says it did not complete"
    return status, note, command


def read_log(path: Path) -> tuple[list[dict], list[dict], str]:
    """(train lines, val lines, note) of a training log; a torn last line (a killed run) is noted."""
    train, val, note = [], [], ""
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    for i, line in enumerate(lines):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:
                note = "its last log line is torn (a killed run) and was not read"
                continue
            raise EaglekitError(f"{path}: line {i + 1} is not JSON", hint="the training log is corrupt") from err
        (val if event.get("event") == "val" else train if event.get("event") == "train" else []).append(event)
    return train, val, note


def training(run: Path, state: dict | None, folder: str = RUN_DRAFT, stage: str = "train") -> Part:
    """Training curves and the best validation of one training run folder."""
    out = run / folder
    manifest, error = read_optional(out / MANIFEST, "draft manifest")
    if error:
        return Part("unreadable", error)
    status, note, command = status_of(state, stage, manifest, complete_key="complete")
    log_path = out / TRAIN_LOG
    if status == "not run" and not log_path.is_file():
        return Part("not run", note)
    train, val, torn = read_log(log_path) if log_path.is_file() else ([], [], "")
    config = (manifest or {}).get("config") or {}
    device = config.get("device")
    if manifest and manifest.get("world_size", 1) > 1:
        device = f"{device}, {manifest['world_size']} processes (DDP)"
    data = {
        "train": train,
        "val": val,
        "best": (manifest or {}).get("best"),
        "steps": (manifest or {}).get("steps"),
        "counts": (manifest or {}).get("counts") or {},
        "step_decay": config.get("step_decay"),
        "ttt_steps": config.get("ttt_steps"),
        "train_fraction": config.get("train_fraction", 1.0),
        "folder": str(out),
    }
    notes = [n for n in (note, torn) if n]
    if manifest is None:
        notes.append("no manifest yet (the first validation had not finished)")
    return Part(
        status,
        "; ".join(notes),
        data,
        Source(
            files=[str(p) for p in (out / MANIFEST, log_path) if p.exists()],
            command=command,
            device=device,
            date=(manifest or {}).get("created"),
        ),
    )


def doctor(run: Path, state: dict | None) -> Part:
    folder = run / RUN_DOCTOR
    report, error = read_optional(folder / DOCTOR_REPORT, "doctor report")
    manifest, error2 = read_optional(folder / MANIFEST, "doctor manifest")
    if error or error2:
        return Part("unreadable", error or error2)
    status, note, command = status_of(state, "doctor", report)
    if report is None:
        return Part(status if status != "done" else "missing", "no doctor/report.json" if status == "done" else note)
    config = (manifest or {}).get("config") or {}
    if manifest is None and status == "done":  # the manifest is written last: the doctor stopped mid-write
        status, note = "unfinished", "no doctor/manifest.json beside the report: the doctor did not finish writing"
    if made_before(folder / DOCTOR_REPORT, run / RUN_DRAFT / MANIFEST):
        status, note = "stale", "made before the current draft was trained: run the doctor again"
    return Part(
        status,
        note,
        report,
        Source(
            files=[str(folder / DOCTOR_REPORT)],
            command=command,
            device=config.get("device"),
            date=(manifest or {}).get("created"),
        ),
    )


def bench(run: Path, state: dict | None, folder: str = RUN_BENCH, stage: str = "bench") -> Part:
    results, error = read_optional(run / folder / BENCH_RESULTS, "bench results")
    if error:
        return Part("unreadable", error)
    status, note, command = status_of(state, stage, results)
    if results is None:
        return Part(
            status if status != "done" else "missing", f"no {folder}/results.json" if status == "done" else note
        )
    s = results["summary"]
    if not (run / folder / MANIFEST).is_file() and status == "done":  # written last: the bench stopped mid-write
        status, note = "unfinished", f"no {folder}/manifest.json beside the results: the bench did not finish writing"
    results["categories"], category_note = categories(results)
    if folder == RUN_BENCH and made_before(run / folder / BENCH_RESULTS, run / RUN_DRAFT / MANIFEST):
        status, note = "stale", "made before the current draft was trained: its figures are an earlier draft's"
    notes = [n for n in (note, category_note) if n]
    return Part(
        status,
        "; ".join(notes),
        results,
        Source(
            files=[str(run / folder / BENCH_RESULTS)],
            command=s.get("command") or command,
            device=s.get("device"),
            date=s.get("date"),
        ),
    )


def categories(results: dict) -> tuple[list[dict], str]:
    """tau per prompt category, weighted by speculation cycles (as the overall tau is), and speedup as
    the bench's headline is: total tokens over total time (`bench/stats.py`)."""
    prompts = results["summary"].get("config", {}).get("prompts")
    lookup, note = prompt_categories(prompts)
    if prompts is None:
        lookup = {r["id"]: "built-in set" for r in results["prompts"]}
    return [{"category": name, **group_stats(rows)} for name, rows in grouped(results["prompts"], lookup).items()], note


def scaling(run: Path, state: dict | None) -> Part:
    table, error = read_optional(run / RUN_SCALING / SCALING_SUMMARY, "scaling summary")
    if error:
        return Part("unreadable", error)
    stages = {k: v for k, v in ((state or {}).get("stages") or {}).items() if k.startswith("scaling-")}
    if table is None:
        failed = [k for k, v in stages.items() if v.get("status") == "failed"]
        if failed:
            return Part("failed", f"{', '.join(failed)} failed; no summary written")
        if stages:
            return Part("unfinished", "slices started, no summary written yet")
        return Part(
            "not run", "no scaling/ in this folder (the recipe has no `scaling` section, or the run has not reached it)"
        )
    rows = table.get("rows", [])
    unfinished = [r["fraction"] for r in rows if r.get("status") != "done"]
    status = "unfinished" if unfinished else "done"
    note = f"slices {unfinished} not finished" if unfinished else ""
    return Part(
        status,
        note,
        table,
        Source(
            files=[str(run / RUN_SCALING / SCALING_SUMMARY)],
            command=table.get("command"),
            device=table.get("device"),
            date=table.get("date"),
        ),
    )


@dataclass
class RunData:
    run: Path
    state: dict | None
    state_note: str
    training: Part
    doctor: Part
    bench: Part
    scaling: Part


def collect(run: str | Path) -> RunData:
    """Everything the report shows, read from `run`.

    Raises:
        EaglekitError: `run` is not a folder, or holds neither a pipeline.json nor any stage output.
    """
    run = Path(run)
    if not run.is_dir():
        raise EaglekitError(f"no run folder {run}", hint="pass the folder `eaglekit run` wrote (e.g. runs/quick)")
    state, error = pipeline_state(run)
    known = (PIPELINE_STATE, RUN_DRAFT, RUN_DOCTOR, RUN_BENCH, RUN_SCALING)
    if state is None and not error and not any((run / k).exists() for k in known):
        raise EaglekitError(
            f"{run} holds no pipeline.json and no stage output ({', '.join(known[1:])})",
            hint="pass the folder `eaglekit run` wrote (e.g. runs/quick)",
        )
    data = RunData(
        run=run,
        state=state,
        state_note=error or "",
        training=training(run, state),
        doctor=doctor(run, state),
        bench=bench(run, state),
        scaling=scaling(run, state),
    )
    stopped = (state or {}).get("stopped_before")
    for part in (data.training, data.doctor, data.bench, data.scaling):
        if stopped and part.status == "not run":
            part.note = f"the run stopped before stage {stopped} (--stop-before)"
    return data
