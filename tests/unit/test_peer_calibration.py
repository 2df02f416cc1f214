"""scripts/peer/calibration.py: the peer's steps for a budget, from its calibration log (the format of
speculators 0.9.0's log, as an H100 run wrote it: one step's timer per line, rich progress bars)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location(
    "calibration", Path(__file__).resolve().parents[2] / "scripts" / "peer" / "calibration.py"
)
calibration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibration)


def log(step_ms: list[str], bar_rate: float) -> str:
    lines = [f"  profile/step_ms={ms}, lr/Muon=1.00e-03," for ms in step_ms]
    lines.append(f"Epoch 0   4% ━                           29/678  [ 0:00:45 < 0:00:30 , {bar_rate:g} it/s ]")
    lines.append("Epoch 0 100% ━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 76/76  [ 0:00:30 < 0:00:00 , 58 it/s ]")  # validation
    return "\n".join(lines)


def test_the_slower_of_step_time_and_bar_rate_and_the_first_steps_compile_as_start_up():
    # 30 steps: the first compiles for 44 s, the rest ~36 ms by the timer; the bar runs 20 it/s (50 ms)
    text = log(["4.39e+04", "244.4"] + ["36.0"] * 28, 20)
    per_step, steps, epochs = calibration.plan(text, wall=96.0, budget=251.0)
    assert per_step == pytest.approx(50.0)
    # start-up: 96 - 30 x 0.05 = 94.5 s (the compile in it); (251 - 94.5) / 0.05 = 3130 steps; 678 a epoch
    assert (steps, epochs) == (3130, 5)


def test_the_timer_when_the_bar_is_faster_or_absent():
    # the bar (20 ms a step) faster than the timer (40): the timer; start-up 10 - 8 x 0.04 s
    text = log(["40.0"] * 8, 50)
    assert calibration.plan(text, wall=10.0, budget=100.0) == (40.0, 2258, 4)
    no_bar = "\n".join(f"profile/step_ms={ms}," for ms in ["40.0"] * 8)
    assert calibration.plan(no_bar, wall=10.0, budget=100.0)[1:] == (2258, calibration.EPOCHS_UNKNOWN)


def test_a_log_without_step_times_is_an_error(tmp_path, capsys):
    path = tmp_path / "calibrate.log"
    path.write_text("Traceback (most recent call last):\n  ...\n")
    assert calibration.main([str(path), "--wall", "5", "--budget", "100"]) == 1
    assert "0 step times" in capsys.readouterr().err


def test_a_budget_that_start_up_would_mostly_eat_is_refused(tmp_path, capsys):
    # the H100's second run: 20 steps in 171 s (a 103-s first-step compile), 71 ms a step, 130 s left
    # after the capture: the plan was one step; now it is an error naming the start-up
    text = log(["1.03e+05", "397.9"] + ["38.0"] * 16 + ["71.4"] * 2, 14)
    with pytest.raises(ValueError, match="start-up"):
        calibration.plan(text, wall=171.0, budget=130.0)
    path = tmp_path / "calibrate.log"
    path.write_text(text)
    assert calibration.main([str(path), "--wall", "171", "--budget", "130"]) == 1
    assert "longer budget" in capsys.readouterr().err
