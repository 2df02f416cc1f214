"""The peer's steps for a budget, from its own calibration run's log (scripts/peer/run_speculators.sh).

    python scripts/peer/calibration.py CALIBRATE_LOG --wall SECONDS --budget SECONDS
    -> "PER_STEP_MS MAX_STEPS EPOCHS"

speculators decays its learning rate over `--max-steps`, not over wall-clock time, so the real run gets
the steps that fit the budget. A step costs the slower of its own timer (`profile/step_ms`, the step
alone) and the training bar's rate ("29/678 [ 0:00:45 < 0:00:30 , 22 it/s ]", which also holds the wait
for the data loader that the real run pays too). Start-up is the calibration's wall time beyond its
steps at that cost: loading, the first steps' compiles, a validation, saving, all paid again.
`--max-steps` ends an epoch, not the run, so the real run also gets the epochs that hold its steps
(the bar's length is the loader's). A budget that start-up would mostly eat is refused: the peer's
draft from a few steps says nothing of the trainer (docs/peers.md).
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

EPOCHS_UNKNOWN = 20  # the peer's own default epochs, where no bar says the loader's length
MIN_TRAINING_SHARE = 0.25  # of the budget left for steps once start-up is paid; below it, no plan


def plan(text: str, wall: float, budget: float) -> tuple[float, int, int]:
    """(ms a step, max steps, epochs) for `budget` seconds, from a calibration log that took `wall` s."""
    ms = [float(x) for x in re.findall(r"step_ms=([0-9.e+-]+)", text)]
    if len(ms) < 4:
        raise ValueError(f"the calibration log holds {len(ms)} step times (profile/step_ms)")
    steady = statistics.median(ms[len(ms) // 2 :])  # the second half: past warm-up and compiles
    bars = re.findall(r"Epoch 0\b[^\n\r]*?\b(\d+)/(\d+)\s+\[[^\]]*?([0-9.]+) it/s", text)
    total = max((int(t) for _, t, _ in bars), default=0)  # the training bar (the validation's is shorter)
    rates = [float(r) for done, t, r in bars if int(t) == total and int(done) > len(ms) // 2 and float(r) > 0]
    per_step = max(steady, 1000 / rates[-1]) if rates else steady
    startup = max(0.0, wall - len(ms) * per_step / 1000)
    if budget - startup < MIN_TRAINING_SHARE * budget:
        raise ValueError(
            f"the peer's start-up ({startup:.0f} s: loading, its first steps' compile) leaves "
            f"{max(budget - startup, 0):.0f} s of the {budget:.0f}-s budget for training, under "
            f"{MIN_TRAINING_SHARE:.0%}: give both trainers a longer budget (the recipe's), "
            "or COUNT_CAPTURE=0"
        )
    steps = max(1, int((budget - startup) * 1000 / per_step))
    return per_step, steps, math.ceil(steps / total) if total else EPOCHS_UNKNOWN


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path)
    p.add_argument("--wall", type=float, required=True, help="the calibration run's wall-clock seconds")
    p.add_argument("--budget", type=float, required=True, help="the real run's seconds")
    args = p.parse_args(argv)
    try:
        per_step, steps, epochs = plan(args.log.read_text(errors="replace"), args.wall, args.budget)
    except ValueError as err:
        print(f"error: {err}: see {args.log}", file=sys.stderr)
        return 1
    print(f"{per_step:.1f} {steps} {epochs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
