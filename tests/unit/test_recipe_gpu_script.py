"""scripts/gpu/recipe_gpu.sh's plumbing, with a stub `python3` first on PATH that records each eaglekit
or pytest command instead of running it (inline `python3 -` / `-c` snippets run for real): a GPU
session is too scarce to find a bash slip in (which arms get which flags, what waits for what)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
STUB = """#!/usr/bin/env bash
if [[ $1 == "-" || $1 == "-c" ]]; then exec {python} "$@"; fi
if [[ $2 == pytest ]]; then sleep 1; fi  # the GPU tier takes a while: training must wait for it, not win a race
printf '%s\\n' "$*" >> {calls}
"""


def run_session(tmp_path: Path, **env: str) -> tuple[list[str], str]:
    """`recipe_gpu.sh start` with the stub; returns the recorded commands (in order) and session.log."""
    bin_dir, eval_dir, work = tmp_path / "bin", tmp_path / "eval", tmp_path / "work"
    bin_dir.mkdir()
    eval_dir.mkdir()
    calls = tmp_path / "calls.txt"
    stub = bin_dir / "python3"
    stub.write_text(STUB.format(python=sys.executable, calls=calls))
    stub.chmod(0o755)
    for name in ("humaneval", "alpaca", "mt_bench"):
        rows = [{"id": f"{name}-{i}", "source": name, "turns": [f"question {i}"]} for i in range(12)]
        (eval_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    full_env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
        "W": str(work),
        "EAGLEKIT_SMOLLM2_DIR": str(tmp_path / "target"),
        **env,
    }
    subprocess.run(
        ["bash", "scripts/gpu/recipe_gpu.sh", "start", str(eval_dir), str(eval_dir)],
        cwd=REPO,
        env=full_env,
        check=True,
        capture_output=True,
    )
    log = work / "session.log"
    deadline = time.monotonic() + 60
    while "session done" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    return calls.read_text().splitlines(), log.read_text()


def test_parallel_arms_get_their_flags_and_the_alternative_data(tmp_path):
    calls, log = run_session(
        tmp_path,
        BENCHES="arms",
        ARMS=f"-;--no-fc-norm --norm-before-fc;--data {tmp_path}/work/run-alt/conversations",
        ARM_STEPS="7",
        ALT_TASKS="alpaca.jsonl,template=translate-fr,weight=0.5",
        EXTRA="generate.limit=5 --stop-before train",
    )
    runs = [c for c in calls if c.startswith("-m eaglekit run")]
    assert len(runs) == 2 and "--out " + str(tmp_path / "work" / "run-alt") in runs[1]
    assert "template=translate-fr" in runs[1] and "template=" not in runs[0]
    assert runs[1].endswith("--stop-before train")  # after the overrides: argparse takes none after it
    trains = {c.split("--out ")[1].split("/")[-2]: c for c in calls if c.startswith("-m eaglekit train")}
    assert sorted(trains) == ["arm-1", "arm-2", "arm-3"]
    assert all("--max-steps 7" in c and "--time-budget-s" not in c for c in trains.values())
    assert "--fc-norm" in trains["arm-1"] and "--norm-before-fc" not in trains["arm-1"]
    assert "--fc-norm" not in trains["arm-2"] and "--no-fc-norm" not in trains["arm-2"]
    assert "--norm-before-fc" in trains["arm-2"] and "--norm-output" in trains["arm-2"]
    assert trains["arm-3"].split("--data ")[-1].startswith(str(tmp_path / "work" / "run-alt"))
    benches = [c for c in calls if c.startswith("-m eaglekit bench")]
    assert len(benches) == 6  # MT-bench and the held-out set, per arm
    held_out = [json.loads(line) for line in (tmp_path / "work" / "heldout10.jsonl").read_text().splitlines()]
    assert [r["id"] for r in held_out if r.get("category") == "translation"] == [
        f"mt_bench-{i}+translate-fr" for i in range(2, 12)
    ]
    assert held_out[-1]["turns"][0].startswith("Translate the following text into French.")
    assert log.count("] done") == 3


def test_checks_beside_the_data_stages_finish_before_training_starts(tmp_path):
    calls, log = run_session(tmp_path, BESIDE="gputests", BENCHES="chain", EXTRA="generate.limit=5")
    runs = [i for i, c in enumerate(calls) if c.startswith("-m eaglekit run")]
    tests = next(i for i, c in enumerate(calls) if c.startswith("-m pytest"))
    assert len(runs) == 2 and calls[runs[0]].endswith("--stop-before train")
    assert "--stop-before" not in calls[runs[1]]
    assert tests < runs[1]  # the recipe goes on to train only once the GPU tier is done
    assert log.index("bench gputests done") < log.index("pipeline exit")
    assert calls[-1].startswith("-m eaglekit bench") and "--mode chain" in calls[-1]


def test_spec_args_reach_every_bench_of_the_draft(tmp_path):
    # --no-plain-fallback in SPEC_ARGS: every tau of the session counted speculating throughout
    calls, log = run_session(
        tmp_path, BENCHES="tree chain heldout", SPEC_ARGS="--no-plain-fallback", LIMIT="7", EXTRA="generate.limit=5"
    )
    benches = [c for c in calls if c.startswith("-m eaglekit bench")]
    assert len(benches) == 3 and all("--no-plain-fallback" in c for c in benches)
    assert (
        "--mode tree" in benches[0]
        and "--limit 7" in benches[0]
        and "--out " + str(tmp_path / "work" / "bench-tree") in benches[0]
    )
    assert "--mode chain" in benches[1] and "--limit 7" in benches[1]
    assert "heldout.jsonl" in benches[2]
    assert "bench tree (MT-bench) done" in log and "unknown bench" not in log


def test_the_sweep_takes_its_shapes_and_a_running_kernels_variant_comes_back_partial(tmp_path):
    calls, log = run_session(
        tmp_path, BENCHES="sweep", SWEEP_SHAPES="tree:4/4/16,tree:6/4/16", SWEEP_PROMPTS="8", EXTRA="generate.limit=5"
    )
    sweep = [c for c in calls if c.startswith("-m eaglekit bench")]
    assert len(sweep) == 1 and "--sweep --sweep-shapes tree:4/4/16,tree:6/4/16 --sweep-prompts 8" in sweep[0]
    # `wait` packs what exists: a finished variant's bench_engine.json, a running one's partial.json
    work = tmp_path / "work"
    for name, files in {"be-done": ("bench_engine.json", "partial.json"), "be-running": ("partial.json",)}.items():
        (work / name).mkdir()
        for f in files:
            (work / name / f).write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "W": str(work), "OUT": str(out)}
    subprocess.run(
        ["bash", "scripts/gpu/recipe_gpu.sh", "wait", "1"], cwd=REPO, env=env, check=True, capture_output=True
    )
    packed = subprocess.run(["tar", "-tzf", out / "results.tar.gz"], capture_output=True, text=True, check=True)
    names = packed.stdout.split()
    assert "be-done/bench_engine.json" in names and "be-running/partial.json" in names
    assert "be-done/partial.json" not in names
