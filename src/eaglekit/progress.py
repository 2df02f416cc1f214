"""A long stage's progress, for a person watching: a tqdm bar on a terminal, and otherwise (a pipe,
a log file, `eaglekit run` under nohup) one log line every `every_s` seconds with what is done, the
rate and the time left, so that no stage is silent for minutes.

    progress = Progress(total=len(plan), done=len(finished), desc="capture", unit="shard")
    progress.update(1, tok_s="12,000")
    progress.close()

Inside `eaglekit run` each line also says the whole run's time left: `run_outlook` in the run's own
process, `run_after` (the environment) in the processes a stage starts (torchrun's ranks, generate's
`--devices` workers).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from tqdm import tqdm

log = logging.getLogger("eaglekit.progress")

# Set by `eaglekit run` while a stage runs in its process: from the stage's own seconds left (None: not
# known yet) to the run's outlook, so a periodic line also tells the run's time left, not only the stage's.
_run_outlook: Callable[[float | None], str] | None = None


@contextlib.contextmanager
def run_outlook(outlook: Callable[[float | None], str]) -> Iterator[None]:
    """Within it, every periodic progress line ends with ' | ' + outlook(its job's seconds left)."""
    global _run_outlook
    earlier, _run_outlook = _run_outlook, outlook
    try:
        yield
    finally:
        _run_outlook = earlier


RUN_AFTER_ENV = "EAGLEKIT_RUN_AFTER"  # JSON: the running stage, its own known time, the stages after it


@dataclass(frozen=True)
class StageTime:
    """What a stage will take, in seconds; `floor`: at least that (a time budget: start-up comes on top)."""

    seconds: float
    floor: bool = False


@dataclass(frozen=True)
class TimeLeft:
    """The run's time left: the sum of what is known, and the stages nothing tells the time of yet
    (then the sum is only a floor, and says so)."""

    seconds: float
    floor: bool
    unknown: tuple[str, ...]

    def text(self) -> str:
        """'about 3m10s left for the run', or 'at least 8m00s ...; not known yet: doctor, bench'."""
        if self.unknown and self.seconds <= 0:
            return f"time left for the run not known yet: {', '.join(self.unknown)}"
        left = f"{'at least' if self.floor or self.unknown else 'about'} {duration(self.seconds)} left for the run"
        return f"{left}; not known yet: {', '.join(self.unknown)}" if self.unknown else left


@contextlib.contextmanager
def run_after(stage: str, own: StageTime | None, after: TimeLeft) -> Iterator[None]:
    """Within it, processes started from here (they inherit the environment) end their progress lines
    with the run's time left: `stage`'s own (their seconds left, else `own`, None if not known) and
    `after`, the stages after it."""
    earlier = os.environ.get(RUN_AFTER_ENV)
    os.environ[RUN_AFTER_ENV] = json.dumps(
        {"stage": stage, "own": None if own is None else asdict(own), "after": asdict(after)}
    )
    try:
        yield
    finally:
        if earlier is None:
            os.environ.pop(RUN_AFTER_ENV, None)
        else:
            os.environ[RUN_AFTER_ENV] = earlier


def stage_and_after(stage: str, own: StageTime | None, after: TimeLeft) -> TimeLeft:
    """The run's time left while `stage` runs: its own time (None if not known) and `after`."""
    if own is None:
        return TimeLeft(after.seconds, after.floor, (stage, *after.unknown))
    return TimeLeft(after.seconds + own.seconds, after.floor or own.floor, after.unknown)


def outlook_from_env(left: float | None) -> str | None:
    """The run's time left in a process a stage started (see `run_after`); None outside `eaglekit run`."""
    raw = os.environ.get(RUN_AFTER_ENV)
    if not raw:
        return None
    try:
        told = json.loads(raw)
        after = TimeLeft(told["after"]["seconds"], told["after"]["floor"], tuple(told["after"]["unknown"]))
        known = StageTime(**told["own"]) if told["own"] else None
        own = StageTime(left) if left is not None else known
        return stage_and_after(told["stage"], own, after).text()
    except (ValueError, KeyError, TypeError, IndexError):  # not ours (a stale or foreign value): no run tail
        return None


def duration(seconds: float) -> str:
    """3725 -> '1h02m', 125 -> '2m05s', 7 -> '7s'."""
    s = int(round(max(seconds, 0)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Counts `unit`s done out of `total`; the rate and the time left are over this run's units only
    (a resumed run's earlier units do not make it look fast).

    Args:
        total: units of the whole job (None: unknown, no time left shown).
        done: units already done before this run (a resume).
        desc, unit: the stage's name and what it counts.
        every_s: seconds between log lines when there is no terminal.
        enabled: False: neither bar nor lines (`--no-progress`, ranks other than 0).
        bar: None: a tqdm bar exactly when stderr is a terminal.
    """

    def __init__(
        self,
        total: int | None,
        *,
        done: int = 0,
        desc: str,
        unit: str,
        every_s: float = 30.0,
        enabled: bool = True,
        bar: bool | None = None,
    ):
        self.total, self.done, self.desc, self.unit, self.every_s = total, done, desc, unit, every_s
        self.enabled = enabled
        self.start = self.last_line = time.perf_counter()
        self.counted = 0
        self.postfix: dict[str, str] = {}
        self.bar = None
        if enabled and (sys.stderr.isatty() if bar is None else bar):
            self.bar = tqdm(total=total, initial=done, desc=desc, unit=unit, dynamic_ncols=True)

    def rate(self) -> float:
        """Units per second in this run."""
        return self.counted / max(time.perf_counter() - self.start, 1e-9)

    def seconds_left(self) -> float | None:
        if self.total is None or self.counted == 0:
            return None
        return max(self.total - self.done, 0) / max(self.rate(), 1e-12)

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        self.counted += n
        self.postfix.update({k: str(v) for k, v in postfix.items()})
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(self.postfix, refresh=False)
            return
        now = time.perf_counter()
        if now - self.last_line >= self.every_s:
            self.last_line = now
            log.info("%s%s", self.line(), self.run_tail())

    def line(self) -> str:
        """'generate: 10240/42201 prompts (24 %), 28.3 prompts/s, tok/s 8,620, 18m49s left'."""
        of = (
            f"/{self.total} {self.unit}s ({100 * self.done / max(self.total, 1):.0f} %)"
            if self.total
            else f" {self.unit}s"
        )
        extra = "".join(f", {k.replace('_', '/')} {v}" for k, v in self.postfix.items())
        left = self.seconds_left()
        tail = f", {duration(left)} left" if left is not None else ""
        return f"{self.desc}: {self.done}{of}, {self.rate():.3g} {self.unit}s/s{extra}{tail}"

    def run_tail(self) -> str:
        """' | the run's time left' inside `eaglekit run` (see run_outlook, run_after), else ''."""
        left = self.seconds_left()
        outlook = _run_outlook(left) if _run_outlook is not None else outlook_from_env(left)
        return f" | {outlook}" if outlook else ""

    def set_total(self, total: int) -> None:
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def close(self) -> float:
        """Ends the bar (or logs a last line); returns this run's seconds."""
        elapsed = time.perf_counter() - self.start
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.counted:
            log.info("%s, done in %s", self.line().split(", ")[0], duration(elapsed))
        return elapsed
