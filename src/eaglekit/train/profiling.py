"""`train --profile-steps A:B`: where a training step's time goes, from torch.profiler.

The trace starts after optimizer step A and stops after step B, each step's logging, validation and
save included (pick a window clear of --val-every and --save-every to see the steps alone);
profile.txt gets the wall and device-busy time a step (device busy well below wall: the host or a
sync is the bottleneck) and the ops sorted by their own device time, then by their own host time.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType

from eaglekit.train.config import profile_window

log = logging.getLogger(__name__)


class StepProfiler:
    def __init__(self, window: str, out: Path, device: torch.device):
        self.first, self.last = profile_window(window)
        self.out, self.device = Path(out), device
        self.profiler = None
        self.started, self.traced_from = 0.0, self.first
        self.written = False

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self, step: int) -> None:
        """Before the loop, with the steps already done (a resumed run): inside the window, trace from here."""
        self.after_step(step)

    def after_step(self, step: int) -> None:
        """Call at the end of every optimizer step's work, with the number of steps done."""
        if self.profiler is None and not self.written and self.first <= step < self.last:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.sync()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.started, self.traced_from = time.perf_counter(), step
        elif step == self.last and self.profiler is not None:
            self.sync()
            wall_s = time.perf_counter() - self.started
            self.profiler.__exit__(None, None, None)
            self.write(wall_s, self.traced_from, step)
            self.profiler = None
            self.written = True

    def write(self, wall_s: float, first: int, last: int) -> None:
        events = self.profiler.key_averages()
        cuda = self.device.type == "cuda"
        steps = last - first
        # Kernels alone: a kernel is also counted as its launching op's device time, and user
        # annotations (Optimizer.step#...) span kernels; torch's own table total skips both.
        device_us = sum(
            e.self_device_time_total
            for e in events
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        )
        lines = [
            f"steps {first + 1}..{last} ({steps}) on {self.device}",
            f"wall {wall_s / steps * 1000:.1f} ms a step"
            + (f", device busy {device_us / steps / 1000:.1f} ms a step" if cuda else ""),
            "",
        ]
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
            where = "before it reached" if step < self.last else "past (it resumed after)"
            log.warning(
                "the run ended at step %d, %s --profile-steps %d:%d: no profile.txt written",
                step,
                where,
                self.first,
                self.last,
            )
