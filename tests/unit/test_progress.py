"""Progress of long stages without a terminal: periodic lines with the rate and the time left."""

from __future__ import annotations

import logging

from eaglekit.progress import Progress, duration, run_outlook


def test_duration_reads_like_a_clock():
    assert [duration(s) for s in (7, 125, 3725, -3)] == ["7s", "2m05s", "1h02m", "0s"]


def test_lines_without_a_terminal_say_done_rate_and_time_left(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("eaglekit.progress.time.perf_counter", lambda: now[0])
    caplog.set_level(logging.INFO, logger="eaglekit.progress")
    p = Progress(100, done=20, desc="generate", unit="prompt", every_s=30, bar=False)  # resumed at 20
    now[0] += 10
    p.update(10, tok_s="1,234")
    assert not caplog.records  # 10 s: under every_s, no line yet
    now[0] += 30
    p.update(10)
    # 20 prompts in this run's 40 s (a resume's earlier 20 do not count): 0.5/s, so the 60 left take 2 min.
    assert caplog.records[-1].getMessage() == "generate: 40/100 prompts (40 %), 0.5 prompts/s, tok/s 1,234, 2m00s left"
    now[0] += 5
    p.close()
    assert caplog.records[-1].getMessage() == "generate: 40/100 prompts (40 %), done in 45s"


def test_disabled_progress_is_silent(caplog):
    caplog.set_level(logging.INFO, logger="eaglekit.progress")
    p = Progress(10, desc="train", unit="step", every_s=0, enabled=False)
    p.update(5)
    p.close()
    assert not caplog.records and p.done == 5


def test_unknown_total_has_no_time_left(caplog):
    caplog.set_level(logging.INFO, logger="eaglekit.progress")
    p = Progress(None, desc="capture", unit="shard", every_s=0, bar=False)
    p.update(3)
    assert (
        caplog.records[-1].getMessage().startswith("capture: 3 shards, ")
        and "left" not in caplog.records[-1].getMessage()
    )


def test_lines_inside_a_run_also_say_the_runs_time_left(caplog, monkeypatch):
    now = [0.0]
    monkeypatch.setattr("eaglekit.progress.time.perf_counter", lambda: now[0])
    caplog.set_level(logging.INFO, logger="eaglekit.progress")
    seen = []
    with run_outlook(lambda left: seen.append(left) or "at least 9m left for the run"):
        p = Progress(10, desc="train", unit="step", every_s=0, bar=False)
        now[0] += 10
        p.update(5)
    assert caplog.records[-1].getMessage().endswith("10s left | at least 9m left for the run") and seen == [10.0]
    p.update(1)  # outside `eaglekit run` (the block closed): no run tail
    assert "|" not in caplog.records[-1].getMessage()


def test_processes_a_stage_starts_say_the_runs_time_left_too():
    """torchrun's ranks and generate's --devices workers are other processes: the pipeline tells them
    the stages after theirs through the environment, and their lines add their own time left."""
    import os
    import subprocess
    import sys

    from eaglekit.progress import RUN_AFTER_ENV, StageTime, TimeLeft, outlook_from_env, run_after

    assert outlook_from_env(60) is None
    with run_after("train", StageTime(480.0, floor=True), TimeLeft(70.0, False, ("bench",))):
        child = subprocess.run(
            [sys.executable, "-c", "from eaglekit.progress import outlook_from_env as o; print(o(60)); print(o(None))"],
            capture_output=True,
            text=True,
            check=True,
        )
    assert child.stdout.splitlines() == [
        "at least 2m10s left for the run; not known yet: bench",
        "at least 9m10s left for the run; not known yet: bench",
    ]
    assert RUN_AFTER_ENV not in os.environ
    with run_after("generate", None, TimeLeft(0.0, False, ())):
        assert outlook_from_env(None) == "time left for the run not known yet: generate"
        assert outlook_from_env(125) == "about 2m05s left for the run"
    os.environ[RUN_AFTER_ENV] = "not json"
    try:
        assert outlook_from_env(10) is None  # a stale or foreign value: no tail, no crash
    finally:
        del os.environ[RUN_AFTER_ENV]
