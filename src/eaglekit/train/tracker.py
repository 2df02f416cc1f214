"""Where training reports go: JSONL log (always), TensorBoard (when installed), a progress bar."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eaglekit.artifacts import TRAIN_LOG
from eaglekit.progress import Progress
from eaglekit.train.state import truncate_log, write_log_line

log = logging.getLogger(__name__)
LOG = TRAIN_LOG


class Tracker:
    """Rank 0's reporting. Every event is one JSON line in OUT/log.jsonl (and TensorBoard scalars).

    Args:
        out: the run folder.
        total_steps: optimizer steps of the run (progress bar length).
        start_step: the step resumed from (log lines after it are dropped: they are redone).
        progress: show progress (a bar on a terminal, else a line every 30 s with the time left).
        enabled: False on ranks other than 0.
    """

    def __init__(self, out: Path, *, total_steps: int, start_step: int, progress: bool, enabled: bool = True):
        self.enabled = enabled
        self.path = out / LOG
        self.bar = None
        self.tb = None
        if not enabled:
            return
        if start_step:
            truncate_log(self.path, start_step)
        elif self.path.exists():
            self.path.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step or None)
        except ImportError:
            log.debug("tensorboard is not installed; logging to %s only", self.path)
        self.bar = Progress(total_steps, done=start_step, desc="train", unit="step", enabled=progress)

    def event(self, kind: str, step: int, **values) -> None:
        if not self.enabled:
            return
        write_log_line(self.path, json.dumps({"event": kind, "step": step, **values}))
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{kind}/{key}", value, step)
                elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                    for j, v in enumerate(value):
                        self.tb.add_scalar(f"{kind}/{key}_{j}", v, step)

    def progress(self, steps: int = 1, **postfix) -> None:
        if self.bar is not None:
            self.bar.update(steps, **postfix)

    def set_total(self, total: int) -> None:
        if self.bar is not None:
            self.bar.set_total(total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
