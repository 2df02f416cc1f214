"""`train --profile-steps A:B`: where a training step's time goes, from torch.profiler.

The trace starts after optimizer step A and stops after step B; profile.txt gets the wall and
device-busy time a step (device busy well below wall: the host or a sync is the bottleneck) and
the ops sorted by their own device time, then by their own host time.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from eaglekit.train.config import profile_window

log = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, window: str, out: Path, device: torch.device):
        self.first, self.last = profile_window(window)
        self.out, self.device = Path(out), device
        self.profiler = None
        self.started = 0.0
        self.written = False

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def after_step(self, step: int) -> None:
        """Call after every optimizer step, with the number of steps done."""
        if step == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.sync()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.started = time.perf_counter()
        elif step == self.last and self.profiler is not None:
            self.sync()
            wall_s = time.perf_counter() - self.started
            self.profiler.__exit__(None, None, None)
            self.write(wall_s, step - self.first)
            self.profiler = None
            self.written = True

    def write(self, wall_s: float, steps: int) -> None:
        events = self.profiler.key_averages()
        cuda = self.device.type == "cuda"
        device_us = sum(e.self_device_time_total for e in events) if cuda else 0.0
        lines = [f"steps {self.first + 1}..{self.last} ({steps}) on {self.device}",
                 f"wall {wall_s / steps * 1000:.1f} ms a step"
                 + (f", device busy {device_us / steps / 1000:.1f} ms a step" if cuda else ""), ""]
        if cuda:
            lines += ["by own device time:", events.table(sort_by="self_device_time_total", row_limit=40), ""]
        lines += ["by own host time:", events.table(sort_by="self_cpu_time_total", row_limit=40)]
        (self.out / "profile.txt").write_text("\n".join(lines) + "\n")

    def close(self, step: int) -> None:
        """At the run's end; one that ended before step B gets no report (it would be partial), and is told so."""
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.profiler = None
        if not self.written:
            log.warning("the run ended at step %d, before --profile-steps %d:%d ended: no profile.txt written",
                        step, self.first, self.last)
