"""Continuous batching: B rows decode together, and a row whose answer ended takes the next prompt.

    from eaglekit.data.batch_decoder import generate_batch
    completions = generate_batch(target, prompts, max_new_tokens=2048, batch_size=256)
    completions[i].tokens, completions[i].finish_reason

`BatchDecoder` holds B rows of L cache slots. A row holds one sequence at slots 0..n-1, so a
token's slot is its position and nothing is padded. The decode step (fixed shape: one CUDA graph)
advances every live row by one token at its own slot (`kv.write_slots` with [B, 1] slots) and
marks on the device the rows that ended (a stop token, or the row's own token limit); an ended row
stops advancing. The host looks every `chunk` steps: it hands out the answers of the rows that
ended and refills those rows with the next prompts at once, in one prefill written into their
rows only (`kv.Refill`); the other rows' caches are untouched. Answers are as long as each
request allows (its own max_new_tokens), never cut to a batch's longest, and a batch never waits
for its longest answer.

A conversation's next turn (a request of the same `session`) goes back to the row its last turn
ended in, while that row is free: the row's cache still holds the last prompt and answer, so only
the tokens the new prompt adds after their common prefix are prefilled (attending to the row's
cached slots). Without it, every turn re-prefilled its whole conversation, and on the recipe's
multi-turn mix the refills prefilled several times the answers' tokens
(docs/results/2026-12-01-h200-late).

`serve` takes requests from a function, so a caller can queue a conversation's next turn as soon
as its answer comes back (`data.local_backend`); `run` answers a list. The runner is the engine's
target runner (FAST when the config allows, else GENERIC): greedy output equals the engine's
plain batch-1 decoding.

Shapes: B rows, R refilled rows, P prompt length (padded within a refill), L cache slots, V vocab,
S stop ids, C a refill's span of cached slots read (0: the prompts attend to themselves only).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

import torch
from tqdm import tqdm

from eaglekit.data.options import REFILL_CAPTURE_AFTER
from eaglekit.data.quality import MAX_PERIOD
from eaglekit.errors import EaglekitError
from eaglekit.runtime.flex import BLOCK
from eaglekit.runtime.graphs import COMPILE_MODE, Step, check_inductor, compiled
from eaglekit.runtime.kv import Refill
from eaglekit.runtime.runner import make_target_runner
from eaglekit.runtime.sampling import Sampling, next_token
from eaglekit.runtime.target_fast import fast_unsupported_reason
from eaglekit.targets.chat import common_prefix
from eaglekit.targets.load import Target

log = logging.getLogger(__name__)
MAX_STOP_IDS = 8  # stop ids the device compares against (padded with -1)
PREFILL_TOKENS = 16384  # prompt tokens (padding included) per refill forward
REFILL_KINDS = ("eager", "graphs", "compiled")
REFILL_MIN = 64  # graphed refills pad prompts to a `bucket` at least this long
SPAN_ALIGN = 64  # eager CPU steps attend to the used slots, rounded up to this
RESUME_SLOTS = 1 << 18  # rows x cached slots one resuming refill reads (64 rows of 4096 slots)
RESUME_MIN = 16  # cached tokens worth resuming (fewer: a shared header, not the session's history)


def check_stop_loops(window: int, slots: int | None = None) -> None:
    """A loop check's window: 0 (off), or at least 2 tokens (a block of p <= W / 2) and at most a row's slots."""
    if window < 0 or window == 1 or (slots is not None and window > slots):
        raise EaglekitError(
            f"--stop-loops {window}"
            + (f" with {slots} slots a row" if slots is not None else "")
            + " is not a loop check's window (stop_loops)",
            hint="give a window of at least 2 tokens (e.g. 128), at most the slots, or 0 for off",
        )


def check_refill_capture_after(uses: int) -> None:
    if uses < 0:
        raise EaglekitError(
            f"--refill-capture-after {uses} is negative", hint="give the eager forwards a bucket runs first, 0 or more"
        )


def check_refill_padding(ratio: float) -> None:
    """A refill's padding cap: 0 (the default) or at least 1 (a forward holds its own tokens)."""
    if ratio and ratio < 1:
        raise EaglekitError(
            f"--refill-padding {ratio} is below 1: a refill forward holds its own tokens at least",
            hint="give a ratio of at least 1 (e.g. 2), or 0 for the default",
        )


@dataclass
class Completion:
    """tokens: new tokens, the stop token included if one ended it; finish_reason "stop" | "length" | "loop"."""

    tokens: list[int]
    finish_reason: str


@dataclass
class Request:
    """One prompt to answer: its token ids, its own length limit, and a key handed back with the answer."""

    ids: list[int]
    max_new_tokens: int
    key: object = None
    session: Hashable | None = None  # a conversation's turns share one: the next resumes in the last one's row
    session_ends: bool = False  # its session's last request: nothing waits for its row after it


def batch_attention(model, max_len: int, runner: str = "auto", attention: str | None = None) -> str | None:
    """The attention kind a BatchDecoder's runner gets: "flex" for the FAST runner on CUDA unless told
    otherwise (rows at different lengths then read only their own cache blocks, where a dense kernel
    reads all L slots of every row, `runtime.flex`); None leaves the runner's own default."""
    cuda = next(model.parameters()).device.type == "cuda"
    fast = runner == "fast" or (runner == "auto" and fast_unsupported_reason(model, max_len) is None)
    return "flex" if attention is None and cuda and fast else attention


def batch_runner(model, *, max_len: int, batch_size: int, runner: str = "auto", attention: str | None = None):
    """The target runner for a BatchDecoder (`batch_attention`; with flex, slots rounded up to its block)."""
    attention = batch_attention(model, max_len, runner, attention)
    if attention == "flex":
        max_len = -(-max_len // BLOCK) * BLOCK
    kernels = {"attention": attention} if attention else {}
    return make_target_runner(model, max_len=max_len, batch_size=batch_size, runner=runner, **kernels)


def padded_mask(pad: torch.Tensor, query_slots: torch.Tensor, max_len: int) -> torch.Tensor:
    """[B] left padding, [T] query slots -> [B, 1, T, L] bool: slots pad_b .. query (causal).

    A padding query sees only itself, so no row of the softmax is empty.
    """
    cols = torch.arange(max_len, device=pad.device).view(1, 1, max_len)
    q = query_slots.view(1, -1, 1)
    seen = (cols >= pad.view(-1, 1, 1)) & (cols <= q)
    return (seen | (cols == q)).unsqueeze(1)


def bucket(n: int) -> int:
    """The least 2^k or 3 * 2^(k-1) >= n (1, 2, 3, 4, 6, 8, 12, 16, 24, ...): a graphed refill's rows
    and prompt length. Powers of two alone padded the recipe's refills heavily; these steps pad a
    dimension by at most half, for twice the graphs. Each is captured on first use (a warm-up run, the
    capture, a sync), so on a short run the extra buckets can cost more than the padding they save
    (docs/notes/engine.md, "Finer buckets"; docs/results/2026-12-01-h200-late)."""
    power = 1 << (n - 1).bit_length()
    return power * 3 // 4 if n <= power * 3 // 4 else power


@dataclass
class Ending:
    """Rows found ended at a round's sync, and their (end slot [E], looped [E], tokens [E, <= L]) copies
    on their way to the host; `event` marks when the copies are done (CUDA), None elsewhere."""

    rows: list[int]
    copies: list[torch.Tensor]
    event: object | None


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A device tensor copied to (pinned) host memory without waiting for the queued work."""
    if t.device.type != "cuda":
        return t  # an indexed copy already
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def next_cover(cover: int, idle_ms: float, step_ms: float, base: int, chunk: int) -> int:
    """The steps to queue ahead of the next round's host work. idle_ms: how long the device waited
    between the end of this round's `cover` steps and the host's next work (CUDA events); step_ms: a
    decode step. Idle: add the steps that would have filled the wait. Not idle: one step fewer, to find
    the least that hides the host. Never below `base` (a quarter of the round), never the whole round."""
    if step_ms <= 0:
        return cover
    if idle_ms > step_ms / 4:
        cover += math.ceil(idle_ms / step_ms)
    else:
        cover -= 1
    return min(max(cover, base), max(chunk - 1, base))


class PhaseClock:
    """Device time spent in named phases of the host loop (decode steps, refills), without a sync of
    its own: on CUDA each phase is bracketed by events that are read once a later sync has passed
    them (`collect`); elsewhere the work runs eagerly and the host's clock is the device's."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.seconds: dict[str, float] = {}
        self.pending: list[tuple[str, object, object]] = []
        self.started = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.pending.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def collect(self) -> None:
        """Add up the phases whose end event has completed (all of them after a sync)."""
        still = []
        for name, start, end in self.pending:
            if end.query():
                self.add(name, start.elapsed_time(end) / 1000)
            else:
                still.append((name, start, end))
        self.pending = still

    def summary(self, steps: int) -> dict:
        """Seconds per phase, the wall time since `reset`, and the share of it the device spent in
        none of the phases (host waits, syncs, answer hand-out)."""
        wall = time.perf_counter() - self.started
        busy = sum(self.seconds.values())
        out = {f"{name}_s": round(s, 3) for name, s in sorted(self.seconds.items())}
        out.update(wall_s=round(wall, 3), other_s=round(max(wall - busy, 0.0), 3))
        if steps and "decode" in self.seconds:
            out["step_ms"] = round(1000 * self.seconds["decode"] / steps, 3)
        return out


class BatchDecoder:
    """Static buffers and the captured decode step for the runner's B rows of L slots.

    Args:
        runner: a target runner (`runtime.runner.make_target_runner`) built with batch_size = B.
        sampling: greedy (temperature 0) or sampling settings.
        graphs, compile: capture the decode step in a CUDA graph / torch.compile it (the fast runner's
            layers one by one, `_compiled_step`).
        chunk: decode steps between host checks.
        prefill_tokens: prompt tokens per refill forward (more refills are split into several).
        refill: "eager" forwards, "graphs" (one CUDA graph per bucket of rows x prompt length) or
            "compiled" (each layer under torch.compile with dynamic shapes: two graphs, fresh and
            resumed prompts, launched eagerly; rows and prompts padded to 2 at least, not to a bucket,
            and nothing captured per shape;
            the whole refill forward compiled with dynamic shapes ran slower than eager on a GPU,
            docs/results/2026-12-01-h200-night: this form is not timed on a GPU yet).
        refill_padding: at most this many padded tokens per prompt token in one refill forward; 0:
            the default, 2 for an eager CPU refill (compute-bound), no cap elsewhere.
        refill_capture_after: graphed refills run a bucket's first N forwards eagerly and capture it
            at its N+1-th (0: at its first): a capture costs several eager forwards, and a bucket that
            a run uses a few times never pays it back.
        stop_loops: W > 0 ends a row (finish_reason "loop") once its answer's last W tokens repeat a
            block of p <= min(W / 2, MAX_PERIOD) tokens (so the block occurs at least 3 times in a
            row), checked on the device after every `chunk` steps; 0: answers run to a stop or their limit.
    """

    def __init__(
        self,
        runner,
        *,
        sampling: Sampling,
        graphs: bool,
        compile: bool,
        chunk: int = 16,
        compile_mode: str = COMPILE_MODE,
        prefill_tokens: int = PREFILL_TOKENS,
        refill: str = "eager",
        refill_padding: float = 0.0,
        refill_capture_after: int = REFILL_CAPTURE_AFTER,
        stop_loops: int = 0,
    ):
        self.runner, self.sampling, self.chunk, self.prefill_tokens = runner, sampling, chunk, prefill_tokens
        if refill not in REFILL_KINDS:
            raise EaglekitError(f"unknown refill kind {refill!r}", hint=f"use one of {REFILL_KINDS}")
        if refill != "eager" and getattr(runner, "kind", None) != "fast":
            raise EaglekitError(
                f"{refill} refills need the fast runner (the generic one runs the HF model's own "
                "code, which may sync with the host)",
                hint="use --refill eager",
            )
        if refill == "compiled":
            check_inductor(next(runner.parameters()).device, "--refill compiled")
        B, L = runner.batch_size, runner.max_len
        self.B, self.L = B, L
        self.device = next(runner.parameters()).device
        long = dict(dtype=torch.long, device=self.device)
        self.tok = torch.zeros(B, 1, **long)  # the token each row feeds next (its last chosen one)
        self.pos = torch.zeros(B, **long)  # its slot = its position
        self.last = torch.zeros(B, **long)  # the slot of the row's last allowed token
        self.live = torch.zeros(B, dtype=torch.bool, device=self.device)  # False: ended or empty
        self.start = torch.zeros(B, **long)  # the slot of the row's first answer token (its prompt length)
        self.looped = torch.zeros(B, dtype=torch.bool, device=self.device)  # ended by the loop check
        self.out = torch.zeros(B, L, **long)  # out[b, s] = the token at slot s of row b
        self.stops = torch.full((MAX_STOP_IDS,), -1, **long)
        self.cols = torch.arange(L, **long)
        self.stop_set: set[int] = set()
        self.steps = self.refills = self.tokens = self.loop_stops = (
            0  # counters since the last `serve` started (`stats`)
        )
        self.refill_tokens = self.refill_padded_tokens = self.resumed_tokens = 0
        self.refill_forwards = self.captures = 0  # refill forwards; refill graphs captured (first uses)
        self.eager_refill_forwards = 0  # graphed refills run eagerly, their bucket not captured yet
        self.capture_s = 0.0  # host seconds of those captures
        # A free row whose cache a session's next turn can resume: session -> (row, tokens at its slots 0..)
        self.kept: dict[Hashable, tuple[int, list[int]]] = {}
        self.kept_by_row: dict[int, Hashable] = {}
        self.clock = PhaseClock(self.device)  # device time of the decode steps and of the refills
        self.step = Step(self._compiled_step(compile, compile_mode), use_graph=graphs, name="batch decode")
        self.refill_kind, self.graphs = refill, graphs
        # On a CPU, attention over all L slots was ~a fifth of a batch-16 step (SmolLM2, 512 slots,
        # contexts of ~100-200 tokens): eager CPU steps of the fast runner attend to the used span.
        self.trim = self.device.type == "cpu" and not graphs and not compile and getattr(runner, "kind", None) == "fast"
        # A CPU forward costs its tokens, padding included; a CUDA one is launch-bound (eager) or a
        # replay (graphed): there fewer forwards win, here less padding does (a round's resumed turns
        # in one forward padded to the longest, docs/results/2026-12-01-cpu-resume).
        compute_bound = self.device.type == "cpu" and refill != "graphs"
        check_refill_padding(refill_padding)
        self.max_padding = refill_padding or (2.0 if compute_bound else 0.0)
        # An eager refill is launch-bound: queueing its kernels from Python takes far longer than their
        # compute (docs/notes/engine.md, "Refills and the stage's time split"). Graphed refills replay
        # one CUDA graph per (rows, prompt length) bucket, captured on first use.
        self.refill_steps: dict[tuple[int, int, int], tuple[Step, tuple[torch.Tensor, ...]]] = {}
        check_refill_capture_after(refill_capture_after)
        self.capture_after = refill_capture_after
        self.bucket_uses: dict[tuple[int, int, int], int] = {}  # eager forwards of a bucket not captured yet
        self.refill_pool = torch.cuda.graph_pool_handle() if graphs and refill == "graphs" else None
        # Compiled refills: sizes 0 and 1 would each compile again (dynamo specializes them), so a
        # refill has at least 2 rows and 2 tokens (`_padded_rows`, `_padded_length`): two graphs in all,
        # with and without cached slots read.
        self.refill_layers = runner.compiled_layers(compile_mode, dynamic=True) if refill == "compiled" else None
        check_stop_loops(stop_loops, L)
        self.stop_loops = stop_loops
        self.loop_check = Step(self._loop_check, use_graph=graphs, name="loop check") if stop_loops else None
        self.step.capture()  # on dummy state: every row empty
        if self.loop_check:
            self.loop_check.capture()
        if self.refill_layers:
            self._compile_refills()

    def _compile_refills(self) -> None:
        """Compile the two refill graphs now (on dummy rows, as the step's capture does), not in the
        first rounds of a serve, whose timing would then hold the compile. The shapes are a refill's
        (up to 16 rows of up to 256 tokens, half of them cached for the resumed graph), not the least
        that compiles: Inductor takes its size hints from the first call."""
        start = time.perf_counter()
        rows = list(range(min(self.B, 16)))
        rows += rows[:1] * (2 - len(rows))  # one row: sent twice, as `_prefill` pads
        n = max(3, min(256, self.L - 1))
        for cached in (0, n // 2):  # prompts alone; prompts reading their rows' cached slots
            self._prefill(rows, [Request([0] * n, 1)] * len(rows), [cached] * len(rows))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.refills = self.refill_forwards = self.refill_tokens = self.refill_padded_tokens = self.resumed_tokens = 0
        log.info("compiled the refills in %.1f s", time.perf_counter() - start)

    def _compiled_step(self, compile: bool, mode: str):
        """The decode step as run: the fast runner's layers compiled one by one (the step's rest is a few
        small kernels, eager inside the CUDA graph; the whole step compiled took several times as long to
        compile: docs/results/2026-12-04-cpu-regional-compile), the generic runner's whole step compiled,
        or eager."""
        if compile and getattr(self.runner, "kind", None) == "fast":
            layers = self.runner.compiled_layers(mode)

            def step() -> None:
                with self.runner.using(layers):
                    self._step()

            return step
        return compiled(self._step, compile, mode)

    def _step(self) -> None:
        B, pos, live = self.B, self.pos, self.live
        L = self._span() if self.trim and not torch.compiler.is_compiling() else self.L  # traced: the fixed shape
        mask = (self.cols[:L].view(1, L) <= pos.view(B, 1)).view(B, 1, 1, L)  # each row: its slots 0..pos
        logits, _ = self.runner(self.tok, pos.view(B, 1), pos.view(B, 1), mask)  # writes slot pos of each row
        chosen = torch.where(live, next_token(logits[:, -1], self.sampling), self.tok.view(B))  # [B]
        nxt = pos + live.long()  # ended rows stay put
        self.out.scatter_(1, nxt.view(B, 1), chosen.view(B, 1))
        ended = (chosen.view(B, 1) == self.stops.view(1, -1)).any(-1) | (nxt >= self.last)
        self.live.copy_(live & ~ended)
        self.tok.copy_(chosen.view(B, 1))
        self.pos.copy_(nxt)

    def _loop_check(self) -> None:
        """End the live rows whose last W answer tokens repeat a block of p tokens (p <= W / 2):
        out[b, s] == out[b, s - p] for every slot s of the window, all inside the answer."""
        B, W = self.B, self.stop_loops
        periods = torch.arange(1, min(W // 2, MAX_PERIOD) + 1, device=self.device)  # [P]
        window = self.pos.view(B, 1) - W + 1 + torch.arange(W, device=self.device).view(1, W)  # [B, W]
        before = window.view(B, 1, W) - periods.view(1, -1, 1)  # [B, P, W]
        now = self.out.gather(1, window.clamp(min=0))
        then = self.out.gather(1, before.clamp(min=0).view(B, -1)).view(before.shape)
        inside = before[:, :, 0] >= self.start.view(B, 1)  # [B, P]
        looped = ((now.view(B, 1, W) == then).all(-1) & inside).any(-1) & self.live  # [B]
        self.looped.logical_or_(looped)
        self.live.logical_and_(~looped)

    def _span(self) -> int:
        """Slots the rows use so far (a multiple of SPAN_ALIGN): an eager CPU step attends to these only
        (reading the tensor costs no device sync there), not to all L slots of the cache."""
        return min(self.L, -(-(int(self.pos.max()) + 1) // SPAN_ALIGN) * SPAN_ALIGN)

    # ---- refilling rows ----------------------------------------------------------------------

    def refill(self, rows: list[int], requests: list[Request], cached: list[int] | None = None) -> None:
        """Prefill the requests' prompts into these rows, in forwards of about `prefill_tokens` (padding
        included). cached[i]: the first tokens of prompt i that row i's cache holds already (resumed,
        not prefilled again); fresh and resumed prompts go in separate forwards."""
        cached = cached or [0] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: (cached[i] > 0, len(requests[i].ids) - cached[i]))
        group: list[int] = []
        for i in order:
            if group and ((cached[group[0]] > 0) != (cached[i] > 0) or not self._fits(group + [i], requests, cached)):
                self._prefill([rows[j] for j in group], [requests[j] for j in group], [cached[j] for j in group])
                group = []
            group.append(i)
        if group:
            self._prefill([rows[j] for j in group], [requests[j] for j in group], [cached[j] for j in group])

    def _fits(self, group: list[int], requests: list[Request], cached: list[int]) -> bool:
        """Whether these prompts go in one forward: within the token and span budgets and, where a
        padding cap applies (`max_padding`; an eager CPU refill's is 2), padded to at most that many
        times their own tokens."""
        new = [len(requests[i].ids) - cached[i] for i in group]
        R, P = self._padded_rows(len(group)), self._padded_length(max(new))
        span = self._span_read(max(len(requests[i].ids) for i in group)) if cached[group[0]] else 0
        padded_ok = not self.max_padding or R * P <= self.max_padding * sum(new)
        return R * P <= self.prefill_tokens and R * span <= RESUME_SLOTS and padded_ok

    def _prefill(self, rows: list[int], requests: list[Request], cached: list[int]) -> None:
        """One forward over R left-padded new prompt tokens (each prompt's tokens after its cached
        ones), written at their slots in their own rows.

        Queued without a sync (inputs built on the host, copied asynchronously), so it runs behind
        the decode steps queued before it."""
        self.refills += len(rows)
        self.refill_forwards += 1
        self.refill_tokens += sum(len(r.ids) - c for r, c in zip(requests, cached))
        self.resumed_tokens += sum(cached)
        P = self._padded_length(max(len(r.ids) - c for r, c in zip(requests, cached)))
        span = self._span_read(max(len(r.ids) for r in requests)) if any(cached) else 0
        extra = self._padded_rows(len(rows)) - len(
            rows
        )  # graphed, compiled: the last request again (same values, same places)
        rows, requests, cached = (
            rows + rows[-1:] * extra,
            requests + requests[-1:] * extra,
            cached + cached[-1:] * extra,
        )
        self.refill_padded_tokens += len(rows) * P
        ids = self._upload([[0] * (P - len(r.ids) + c) + r.ids[c:] for r, c in zip(requests, cached)])  # [R, P]
        lists = ([len(r.ids) for r in requests], [r.max_new_tokens for r in requests], rows, cached)
        inputs = (ids, *(self._upload(x) for x in lists))
        if self.refill_kind == "graphs":
            self._refill_graphed(inputs, span)
        elif self.refill_kind == "compiled":
            with self.runner.using(self.refill_layers):
                self._refill_rows(*inputs, span=span)
        else:
            self._refill_rows(*inputs, span=span)

    def _padded_length(self, longest: int) -> int:
        """Graphed refills pad prompts to a bucket (`bucket`, at least REFILL_MIN, at most the row's
        slots): few buckets, each a graph; eager ones to the longest; compiled ones to the longest, at
        least 2 (see `refill_layers`)."""
        if self.refill_kind == "graphs":
            return min(bucket(max(longest, REFILL_MIN)), self.L)
        return max(longest, 2) if self.refill_kind == "compiled" else longest

    def _padded_rows(self, rows: int) -> int:
        return (
            bucket(rows) if self.refill_kind == "graphs" else max(rows, 2) if self.refill_kind == "compiled" else rows
        )

    def _span_read(self, longest: int) -> int:
        """The cached slots a resuming refill reads: its longest prompt's; graphed, a power of two. It is
        a third bucket dimension, and each new (rows, length, span) costs a capture: the finer row and
        length buckets alone added refill time to a short run (docs/results/2026-12-01-h200-late)."""
        if self.refill_kind != "graphs":
            return longest
        return min(max(REFILL_MIN, 1 << (longest - 1).bit_length()), self.L)

    def _refill_graphed(self, inputs: tuple[torch.Tensor, ...], span: int) -> None:
        """The refill as a replay of its bucket's graph (ids [R, P], n, budget, rows, cached [R]; C),
        captured on the bucket's first use after `capture_after` eager forwards, with these inputs in
        its buffers: the capture's warm-up runs the refill, and the replay runs it again (the same
        state; sampled, the replay's token is the one kept)."""
        R, P = inputs[0].shape
        key = (R, P, span)
        first_use = key not in self.refill_steps
        if first_use and self.bucket_uses.get(key, 0) < self.capture_after:  # not worth a capture yet
            self.bucket_uses[key] = self.bucket_uses.get(key, 0) + 1
            self.eager_refill_forwards += 1
            self._refill_rows(*inputs, span=span)
            return
        if first_use:
            buffers = tuple(torch.empty_like(t) for t in inputs)
            step = Step(
                lambda: self._refill_rows(*buffers, span=span),
                use_graph=self.graphs,
                name=f"refill {R}x{P}" + (f" reading {span} slots" if span else ""),
                pool=self.refill_pool,
            )
            self.refill_steps[key] = step, buffers
        step, buffers = self.refill_steps[key]
        for buffer, t in zip(buffers, inputs):
            buffer.copy_(t, non_blocking=True)
        if first_use:
            start = time.perf_counter()
            step.capture(warmup=1, quiet=True)
            self.capture_s += time.perf_counter() - start
            self.captures += 1
        step()

    def _refill_rows(
        self,
        ids: torch.Tensor,
        n: torch.Tensor,
        budget: torch.Tensor,
        rows: torch.Tensor,
        cached: torch.Tensor,
        span: int = 0,
    ) -> None:
        """ids [R, P] the left-padded new tokens of prompts of lengths n [R] whose first cached [R]
        tokens the rows hold, token budgets [R], cache rows [R]: the forward and the rows' new state,
        tensors only (so that it is captured in a graph). span C > 0: the new tokens attend to their
        rows' slots 0..C-1 (cached and new); 0: nothing is cached, they attend to themselves only."""
        R, P = ids.shape
        pad = P - (n - cached)  # [R]
        cols = torch.arange(P, device=ids.device).view(1, P)
        k = cols - pad.view(R, 1)  # the index among the new tokens; < 0: padding
        # Padding goes to slots after the prompt (the row writes them later, before it reads them).
        slots = torch.where(k >= 0, cached.view(R, 1) + k, (n.view(R, 1) + cols).clamp(max=self.L - 1))  # [R, P]
        positions = (cached.view(R, 1) + k).clamp(min=0)
        if span:  # each token sees its row's slots up to its own: a padding token's is past the prompt
            mask = (torch.arange(span, device=ids.device).view(1, 1, span) <= slots.view(R, P, 1)).unsqueeze(1)
        else:
            mask = padded_mask(pad, cols.view(P), P)
        logits, _ = self.runner(ids, positions, Refill(rows, slots, span), mask, last_only=True)
        first = next_token(logits[:, -1], self.sampling)  # [R]
        # A row sent twice (a graphed refill's padding) keeps its first copy's token: sampled, the copies may
        # differ, and an index_put from two sources leaves tok / out / live each with either one.
        first = first[(rows.view(-1, 1) == rows.view(1, -1)).int().argmax(1)]
        self.tok[rows] = first.view(-1, 1)
        self.pos[rows] = n
        self.start[rows] = n
        self.looped.index_fill_(0, rows, False)  # a scalar fill: no host tensor in a captured graph
        self.last[rows] = n + budget - 1
        self.out[rows, n] = first
        stopped = (first.view(-1, 1) == self.stops.view(1, -1)).any(-1)
        self.live[rows] = ~stopped & (budget > 1)

    def _upload(self, values: list) -> torch.Tensor:
        """A host list as a long tensor on the device, copied without waiting for the queued work."""
        t = torch.tensor(values, dtype=torch.long)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    # ---- the host loop -----------------------------------------------------------------------

    def check(self, request: Request) -> None:
        """Refuse a request the rows cannot hold."""
        if not request.ids:
            raise EaglekitError("an empty prompt was given", hint="every prompt needs at least one token")
        if request.max_new_tokens < 1:
            raise EaglekitError(f"max_new_tokens is {request.max_new_tokens}", hint="ask for at least one token")
        if len(request.ids) + request.max_new_tokens > self.L:
            raise EaglekitError(
                f"a prompt of {len(request.ids)} tokens + max_new_tokens {request.max_new_tokens} "
                f"exceeds the decoder's {self.L} slots per row",
                hint="build the decoder with a larger max_len, or shorten the prompt",
            )

    def set_stop_ids(self, stop_ids) -> None:
        ids = sorted(set(int(t) for t in stop_ids))
        if len(ids) > MAX_STOP_IDS:
            raise EaglekitError(
                f"{len(ids)} stop ids, the batch decoder compares at most {MAX_STOP_IDS}",
                hint="pass fewer stop token ids",
            )
        self.stop_set = set(ids)  # the host's copy: reading the device's would sync
        self.stops.fill_(-1)
        self.stops[: len(ids)] = torch.tensor(ids, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def serve(self, take: Callable[[], Request | None], stop_ids) -> Iterator[tuple[Request, Completion]]:
        """Answer requests until `take()` returns None and every row has ended.

        `take` is asked whenever a row is free; a request it returns after an answer was yielded
        (a conversation's next turn) is served in the same run. Answers come back as they end.

        One round: read which rows ended (the one sync) and start copying their tokens; queue the
        first `cover` decode steps; read the copies, hand out the answers and take requests for the
        free rows while the GPU runs those steps; queue the new rows' prefill, then the round's other
        steps and the loop check. A freed row so idles for the rest of the round it ended in and
        `cover` steps, not two more rounds. On CUDA `cover` follows the device's idle time before the
        refill (`next_cover`): on the recipe's multi-turn mix the host's work of a round outlasted the
        steps queued ahead of it and the GPU idled (docs/notes/engine.md, "Steps ahead follow the host");
        a freed row idling a step more costs far less than all rows idling.
        """
        self.set_stop_ids(stop_ids)
        self.live.zero_()
        self.steps = self.refills = self.tokens = self.refill_tokens = self.refill_padded_tokens = self.loop_stops = 0
        self.resumed_tokens = self.refill_forwards = self.captures = 0
        self.capture_s = 0.0
        self.kept.clear()
        self.kept_by_row.clear()
        self.clock.reset()
        self.host = dict.fromkeys(("wait", "ended", "answers", "take"), 0.0)  # host seconds by part (`stats`)
        self.cover_rounds = self.cover_total = 0
        held: list[Request | None] = [None] * self.B  # the request each row answers
        free = list(range(self.B))  # the longest free first (its cache the least likely resumed)
        cover = base = max(1, self.chunk // 4)  # steps queued ahead of the host's work
        ending: Ending | None = None
        while True:
            ending_rows = set(ending.rows) if ending else set()
            busy = any(r is not None and b not in ending_rows for b, r in enumerate(held))
            covered = None
            if busy:
                self._decode(cover)
                covered = self._mark()  # the device reaches it when the cover steps end
                self.cover_rounds, self.cover_total = self.cover_rounds + 1, self.cover_total + cover
            host = time.perf_counter()
            ended = self._ended(ending, held, free)  # the ended rows' answers, freed
            handed = time.perf_counter()
            yield from self._answers(ended)  # the caller's work on them runs here
            answered = time.perf_counter()
            taken = self._take(take, free)
            queued = self._mark()  # reached when the host has queued the work after it
            if taken:
                with self.clock.phase("refill"):
                    self.refill(*(list(x) for x in zip(*taken)))
                for row, request, _ in taken:
                    held[row] = request
            self._add_host(ended=handed - host, answers=answered - handed, take=time.perf_counter() - answered)
            if not taken and not busy:
                return
            self._decode(self.chunk - cover if busy else self.chunk, check=True)
            ending = self._ending(held)  # sync; the ended rows' copies start
            self.clock.collect()  # the round's events have completed
            if covered is not None and queued is not None:
                step_ms = 1000 * self.clock.seconds.get("decode", 0.0) / max(self.steps, 1)
                cover = next_cover(cover, covered.elapsed_time(queued), step_ms, base, self.chunk)

    def _mark(self):
        """A CUDA event recorded on the rows' device (None on a CPU): where the device is in the queue."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _add_host(self, **seconds: float) -> None:
        for part, value in seconds.items():
            self.host[part] += value

    def _decode(self, steps: int, check: bool = False) -> None:
        """Queue `steps` batch decode steps (then the loop check, if asked and on)."""
        with self.clock.phase("decode"):
            for _ in range(steps):
                self.step()
            if check and self.loop_check:
                self.loop_check()
        self.steps += steps

    def _take(self, take: Callable[[], Request | None], free: list[int]) -> list[tuple[int, Request, int]]:
        """(row, request, prompt tokens its cache holds) for the free rows, as many as `take` has now."""
        taken = []
        while free and (request := take()) is not None:
            self.check(request)
            taken.append(self._row_for(request, free))
        return taken

    def _row_for(self, request: Request, free: list[int]) -> tuple[int, Request, int]:
        """A free row for the request: the one its session's last turn ended in (resumed where its cache
        begins the prompt: only the rest is prefilled), else one no session waits for."""
        row, tokens = self.kept.get(request.session, (None, [])) if request.session is not None else (None, [])
        cached = min(common_prefix(tokens, request.ids), len(request.ids) - 1)  # the last token's logits are needed
        if cached < RESUME_MIN:
            cached = 0
        if row is None:  # a row no session waits for, else the longest free
            row = next((r for r in free if r not in self.kept_by_row), free[0])
        free.remove(row)
        self._forget(row)
        return row, request, cached

    def _keep(self, row: int, session: Hashable, tokens: list[int]) -> None:
        """Remember what a freed row's cache holds (tokens at slots 0..), for its session's next turn."""
        if session in self.kept:
            self._forget(self.kept[session][0])
        self.kept[session] = (row, tokens)
        self.kept_by_row[row] = session

    def _forget(self, row: int) -> None:
        session = self.kept_by_row.pop(row, None)
        if session is not None:
            del self.kept[session]

    def _ending(self, held: list) -> Ending | None:
        """Which rows ended since the last look (the round's sync), and their end slots, loop flags and
        tokens on their way to the host: copied before the next steps are queued, read after (`_ended`)."""
        wait = time.perf_counter()
        live = self.live.cpu().tolist()  # the sync of the round (the GIL is released)
        self._add_host(wait=time.perf_counter() - wait)
        rows = [b for b in range(self.B) if held[b] is not None and not live[b]]
        if not rows:
            return None
        index = torch.tensor(rows, device=self.device)
        longest = min(
            self.L, max(len(held[b].ids) + held[b].max_new_tokens for b in rows)
        )  # a row's last slot + 1, at most
        copies = [to_host(t) for t in (self.pos[index], self.looped[index], self.out[index, :longest])]
        return Ending(rows, copies, self._mark())

    def _ended(self, ending: Ending | None, held: list, free: list[int]) -> list[tuple[Request, list[int], bool]]:
        """(request, answer tokens, looped) of the rows `_ending` found; frees them, and keeps what a
        session's row holds for its next turn."""
        if ending is None:
            return []
        if ending.event is not None:
            ending.event.synchronize()  # the copies only, not the steps queued after them
        ends, looped, outs = ending.copies
        ends, looped = ends.tolist(), looped.tolist()
        ended = []
        for i, b in enumerate(ending.rows):
            request = held[b]
            answer = outs[i, len(request.ids) : ends[i] + 1].tolist()  # the answer starts at the prompt's length
            ended.append((request, answer, looped[i]))
            if (
                request.session is not None and not request.session_ends
            ):  # slots 0..end-1: the prompt and the answer but its last token
                self._keep(b, request.session, request.ids + answer[:-1])
            held[b] = None
            free.append(b)
        return ended

    def _answers(self, ended: list) -> Iterator[tuple[Request, Completion]]:
        for request, tokens, looped in ended:
            self.tokens += len(tokens)
            self.loop_stops += looped
            reason = "loop" if looped else "stop" if tokens[-1] in self.stop_set else "length"
            yield request, Completion(tokens=tokens, finish_reason=reason)

    def stats(self) -> dict:
        """Steps, refills and answer tokens of the last `serve`; occupancy = the share of row-steps that
        made a token (the rest: rows that ended or wait for their prefill, computed and ignored)."""
        made = self.tokens - self.refills  # a refill's first token comes from its prefill
        self.clock.collect()
        return {
            "rows": self.B,
            "slots": self.L,
            "chunk": self.chunk,
            "steps": self.steps,
            "refills": self.refills,
            "answer_tokens": self.tokens,
            "occupancy": round(made / max(self.steps * self.B, 1), 4),
            "refill_tokens": self.refill_tokens,
            "refill_padded_tokens": self.refill_padded_tokens,
            "resumed_tokens": self.resumed_tokens,
            "refill_forwards": self.refill_forwards,
            "refill_graphs": self.captures,
            "refill_capture_s": round(self.capture_s, 3),
            "refill_eager_forwards": self.eager_refill_forwards,
            "loop_stops": self.loop_stops,
            **{f"host_{part}_s": round(seconds, 3) for part, seconds in getattr(self, "host", {}).items()},
            "cover_steps": round(self.cover_total / self.cover_rounds, 2) if getattr(self, "cover_rounds", 0) else None,
            **self.clock.summary(steps=self.steps),
        }

    def run(self, prompts: list[list[int]], max_new_tokens: int, stop_ids) -> list[Completion]:
        """Answer every prompt (any number of them); completions in the order given."""
        requests = iter([Request(list(p), max_new_tokens, key=i) for i, p in enumerate(prompts)])
        results: list[Completion | None] = [None] * len(prompts)
        for request, completion in self.serve(lambda: next(requests, None), stop_ids):
            results[request.key] = completion
        return results


@torch.no_grad()
def generate_batch(
    target,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    stop_token_ids=None,
    batch_size: int = 32,
    runner: str = "auto",
    graphs: bool | None = None,
    compile: bool | None = None,
    seed: int | None = None,
    max_len: int | None = None,
    attention: str | None = None,
    progress: bool = False,
) -> list[Completion]:
    """Generate an answer for every prompt with continuous batching (the fast path for data).

    Args:
        target: a loaded `eaglekit.targets.Target` (or an HF causal LM, then pass stop_token_ids).
        prompts: token ids of each prompt, chat template already applied (`target.chat.prompt_ids`).
        max_new_tokens: length limit per answer.
        sampling: greedy by default; temperature / top_p / top_k for sampling.
        stop_token_ids: ids that end an answer (default: the target's EOS / end-of-turn ids).
        batch_size: rows decoded together (the KV cache holds batch_size x max_len slots).
        runner: "auto", "fast" or "generic" (see `runtime.runner`).
        graphs, compile: CUDA graphs / torch.compile (default: on when the model is on CUDA).
        seed: seeds sampling.
        max_len: cache slots per row (default: longest prompt + max_new_tokens, rounded up to 64).
        attention: the FAST runner's attention kind (default: "flex" on CUDA, see `batch_runner`).
        progress: show a tqdm bar over answers.

    Returns:
        One `Completion` per prompt, in the order given.
    """
    model = target.model if isinstance(target, Target) else target
    if stop_token_ids is None:
        if not isinstance(target, Target):
            raise EaglekitError("no stop token ids given", hint="pass stop_token_ids or a loaded Target")
        stop_token_ids = target.stop_token_ids
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise EaglekitError("an empty prompt was given", hint="every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    max_len = max_len or -(-(longest + max_new_tokens) // 64) * 64
    cuda = next(model.parameters()).device.type == "cuda"
    graphs = cuda if graphs is None else graphs
    compile = cuda if compile is None else compile
    if seed is not None:
        torch.manual_seed(seed)
    built = batch_runner(
        model, max_len=max_len, batch_size=min(batch_size, len(prompts)), runner=runner, attention=attention
    )
    decoder = BatchDecoder(built, sampling=sampling, graphs=graphs, compile=compile)
    requests = iter([Request(list(p), max_new_tokens, key=i) for i, p in enumerate(prompts)])
    results: list[Completion | None] = [None] * len(prompts)
    answers = decoder.serve(lambda: next(requests, None), stop_token_ids)
    if progress:
        answers = tqdm(answers, total=len(prompts), desc="generate", unit="answer")
    for request, completion in answers:
        results[request.key] = completion
    return results
