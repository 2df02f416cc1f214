"""Token-level batched generation with the target, behind one small interface.

`TokenGenerator.generate(prompts, max_new_tokens)` takes token-id prompts of any lengths and
returns, per prompt, the new token ids (up to and including the first stop token) and why they
ended. Two implementations:

- `HFGenerator`: Hugging Face `generate`, batched with left padding: what a user would otherwise
  run, kept as `--backend hf` so the benchmark can compare against it.
- `EngineGenerator`: eaglekit's own continuous-batching decoder (`eaglekit.data.batch_decoder`), CUDA
  graphs and torch.compile on GPU: the fast path, and the default (`--backend local`). It also
  streams (`serve`): rows are refilled as answers end, and a conversation's next turn can be queued
  as soon as its answer is back.

Both take the engine's `Sampling` (the one vocabulary for temperature / top-p / top-k) and a
separate `seed`: the seed is the data stage's, the engine leaves seeding to its caller.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Iterator

import torch

from eaglekit.data.batch_decoder import (
    BatchDecoder,
    Request,
    batch_attention,
    batch_runner,
    check_refill_capture_after,
    check_refill_padding,
    check_stop_loops,
)
from eaglekit.data.options import REFILL_CAPTURE_AFTER, GenerateOptions
from eaglekit.errors import EaglekitError
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets.load import text_config

log = logging.getLogger(__name__)


@dataclass
class Completion:
    token_ids: list[int]  # new tokens, the stop token included when finish_reason == "stop"
    finish_reason: str  # "stop", "length" or "loop" (ended by the engine's --stop-loops check)


def cut_at_stop(tokens: list[int], stop_ids: set[int], max_new_tokens: int) -> Completion:
    """The generated tokens up to the first stop token (kept), and the finish reason."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return Completion(tokens[: i + 1], "stop")
    return Completion(tokens[:max_new_tokens], "length")


class HFGenerator:
    """Batched Hugging Face `generate` with left padding.

    Args:
        model: the target (an `AutoModelForCausalLM`).
        stop_ids: token ids that end a turn.
        sampling: sampling settings (temperature 0: greedy).
        seed: seeds torch's generator once, so a run's samples repeat.
    """

    name = "hf"
    continuous = False  # answers a batch at a time (`generate`), as a user of HF would

    def __init__(self, model, stop_ids: list[int], sampling: Sampling, *, seed: int = 0):
        if not stop_ids:
            raise EaglekitError("the target has no stop token", hint="set eos_token_id in generation_config.json")
        self.model, self.stop_ids, self.sampling = model, list(stop_ids), sampling
        self.pad_id = self.stop_ids[0]
        torch.manual_seed(seed)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Completion]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        # Left padding: every row's last prompt token sits in the same column, where decoding starts.
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, P]
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P]
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        s = self.sampling
        kwargs = (
            dict(do_sample=False)
            if s.greedy
            else dict(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        )  # top_k 0: off
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            **kwargs,
        )  # [B, P + T]
        new = out[:, width:].tolist()
        stops = set(self.stop_ids)
        return [cut_at_stop(row, stops, max_new_tokens) for row in new]


class Streaming:
    """A generator that serves requests as rows free up (`serve(take)` yields (request, completion) as
    answers end); `generate` answers a fixed list through it, in the order given."""

    continuous = True  # LocalBackend streams a conversation's next turn to `serve` as its answer ends

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Completion]:
        requests = iter([Request(list(p), max_new_tokens, key=i) for i, p in enumerate(prompts)])
        out: list[Completion | None] = [None] * len(prompts)
        for request, completion in self.serve(lambda: next(requests, None)):
            out[request.key] = completion
        return out


class EngineGenerator(Streaming):
    """eaglekit's continuous-batching decoder (`eaglekit.data.batch_decoder.BatchDecoder`).

    `serve(take)` keeps `batch_size` rows busy: a row whose answer ended is refilled at once with the
    next request, and a caller may queue a conversation's next turn as soon as its answer comes
    back (`LocalBackend`). One decoder (runner, KV cache, captured CUDA graph) is kept for the whole
    run; a request that needs more cache slots than its rows hold waits until the rows drain, and
    the decoder is then rebuilt larger (compile and capture again: logged).

    Args:
        model: the target.
        stop_ids: token ids that end a turn.
        sampling: sampling settings (temperature 0: greedy).
        seed: seeds torch's generator once, so a run's samples repeat.
        batch_size: rows decoded together.
        runner: "auto", "fast" or "generic" (see `eaglekit.runtime.runner`).
        graphs, compile: CUDA graphs / torch.compile (default: on when the model is on CUDA).
        attention: the FAST runner's attention kind (`runtime.kv.ATTENTION_KINDS`); None: "flex" on
            CUDA, else the runner's default (`data.batch_decoder.batch_runner`).
        chunk: decode steps between host checks.
        max_len: cache slots per row of the first decoder (default: what the first request needs,
            rounded up to `SLOTS`, at least `MIN_SLOTS` with flex attention, at most the target's context).
        refill: "eager", "graphs" or "compiled" prefills of the rows that free up (`data.batch_decoder.BatchDecoder`);
            refill_padding, refill_capture_after: its padding cap and graphed buckets' eager forwards.
        stop_loops: end an answer once its last N tokens repeat a block (`data.batch_decoder.BatchDecoder`); 0: off.
    """

    name = "engine"
    SLOTS = 512  # cache slots are rounded up to a multiple of this, so few rebuilds happen
    MIN_SLOTS = 2048  # with flex attention: room for longer later prompts (a next turn) without a rebuild

    def __init__(
        self,
        model,
        stop_ids: list[int],
        sampling: Sampling,
        *,
        seed: int = 0,
        batch_size: int = 32,
        runner: str = "auto",
        graphs: bool | None = None,
        compile: bool | None = None,
        attention: str | None = None,
        chunk: int = 16,
        max_len: int | None = None,
        refill: str = "eager",
        refill_padding: float = 0.0,
        refill_capture_after: int = REFILL_CAPTURE_AFTER,
        stop_loops: int = 0,
    ):
        if not stop_ids:
            raise EaglekitError("the target has no stop token", hint="set eos_token_id in generation_config.json")
        cuda = next(model.parameters()).device.type == "cuda"
        self.model, self.stop_ids, self.sampling, self.batch_size = model, list(stop_ids), sampling, batch_size
        self.runner, self.attention, self.chunk, self.first_max_len = runner, attention, chunk, max_len
        self.refill, self.refill_padding, self.stop_loops = refill, refill_padding, stop_loops
        self.refill_capture_after = refill_capture_after
        self.graphs = cuda if graphs is None else graphs
        self.compile = cuda if compile is None else compile
        self.context = getattr(text_config(model.config), "max_position_embeddings", None)
        self._decoder, self.max_len, self.builds = None, 0, 0
        self.decoder_runs: list[dict] = []  # the decoder's `stats()` after each of its serve loops
        torch.manual_seed(seed)

    def prepare(self, max_prompt_tokens: int, max_new_tokens: int) -> float:
        """Build (compile, capture) the decoder for prompts up to this length now; returns seconds."""
        start = time.perf_counter()
        self._decoder_for(max_prompt_tokens + max_new_tokens)
        return time.perf_counter() - start

    def _slots_for(self, needed: int) -> int:
        """Slots per row of the next decoder: rounded up, grown by half at least, within the context.
        Spare slots cost only memory when attention reads each row's own blocks ("flex"), but a
        step's time where it reads them all: then there are none beyond the rounding."""
        if self._decoder is None and self.first_max_len:
            return max(needed, self.first_max_len)
        floor = self.MIN_SLOTS if batch_attention(self.model, needed, self.runner, self.attention) == "flex" else 0
        rounded = -(-max(needed, floor) // self.SLOTS) * self.SLOTS
        grown = max(rounded, int(self.max_len * 1.5) // self.SLOTS * self.SLOTS)
        return max(needed, min(grown, self.context or grown))  # no slots past the target's context

    def _decoder_for(self, needed: int):
        if self._decoder is None or needed > self.max_len:
            max_len = self._slots_for(needed)
            self._decoder = None  # free the old cache before the new one is allocated: its steps (bound
            gc.collect()  # methods, graphs) refer back to it, so only the collector frees it
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            start = time.perf_counter()
            runner = batch_runner(
                self.model, max_len=max_len, batch_size=self.batch_size, runner=self.runner, attention=self.attention
            )
            self._decoder = BatchDecoder(
                runner,
                sampling=self.sampling,
                graphs=self.graphs,
                compile=self.compile,
                chunk=self.chunk,
                refill=self.refill,
                refill_padding=self.refill_padding,
                refill_capture_after=self.refill_capture_after,
                stop_loops=self.stop_loops,
            )
            self.max_len, self.builds = runner.max_len, self.builds + 1
            log.info(
                "engine batch decoder: %d rows x %d slots, %s runner (%s attention), graphs=%s, compile=%s "
                "(built in %.1f s)",
                self.batch_size,
                runner.max_len,
                runner.kind,
                getattr(runner, "attention", "the model's"),
                self.graphs,
                self.compile,
                time.perf_counter() - start,
            )
        return self._decoder

    def serve(self, take) -> Iterator[tuple[Request, Completion]]:
        """Answer the requests `take()` returns (None: no more now) as rows free up; yields
        (request, completion) as answers end. Requests longer than the rows wait for a larger decoder."""
        ready: deque[Request] = deque()  # taken, and fit the rows
        later: list[Request] = []  # taken, too long for the rows: after the rebuild

        def fitting() -> Request | None:
            while True:
                request = ready.popleft() if ready else take()
                if request is None or len(request.ids) + request.max_new_tokens <= self.max_len:
                    return request
                later.append(request)

        first = take()
        if first is None:
            return
        ready.append(first)
        self._decoder_for(len(first.ids) + first.max_new_tokens)
        stops = set(self.stop_ids)
        while True:
            for request, done in self._decoder.serve(fitting, self.stop_ids):
                completion = cut_at_stop(done.tokens, stops, request.max_new_tokens)
                if done.finish_reason == "loop":  # the decoder's loop check ended it (no stop token in it)
                    completion.finish_reason = "loop"
                yield request, completion
            self.decoder_runs.append(self._decoder.stats())
            if not later:
                return
            log.info("%d requests need more than %d slots per row: rebuilding the decoder", len(later), self.max_len)
            self._decoder_for(max(len(r.ids) + r.max_new_tokens for r in later))
            ready.extend(later)
            later.clear()

    def run_stats(self) -> dict:
        """Where the decoder's time went, per serve loop (a rebuild starts a new one): steps, refills,
        occupancy and device seconds in decode steps / refills (`data.batch_decoder.BatchDecoder.stats`)."""
        return {"builds": self.builds, "serve_loops": self.decoder_runs}


def _default(name: str):
    return next(f.default for f in fields(GenerateOptions) if f.name == name)


@dataclass(frozen=True)
class EngineSettings:
    """The settings of eaglekit's engine among `generate`'s (and `prompts synthesize`'s) options, in
    one value: declared once in `data.options.GenerateOptions` (the defaults come from there), read
    from the parsed flags at once, checked before any model loads, handed whole to `make_generator`.
    attention: the engine's kernel ("auto": `data.batch_decoder.batch_attention`); cache_slots: the slots
    per row of its first cache (None: grown as prompts need); refill: how it prefills new rows
    (`data.batch_decoder.REFILL_KINDS`); refill_padding: the cap on a refill forward's padded tokens per
    prompt token (0: the default); stop_loops: the window of the engine's loop check (0: off)."""

    attention: str = _default("attention")
    cache_slots: int | None = _default("cache_slots")
    refill: str = _default("refill")
    refill_padding: float = _default("refill_padding")
    refill_capture_after: int = _default("refill_capture_after")
    stop_loops: int = _default("stop_loops")

    @classmethod
    def from_args(cls, args) -> "EngineSettings":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    def check(self, backend: str) -> None:
        """Valid for the engine; refused for another backend (where they would do nothing)."""
        if backend in ("local", "engine"):
            if self.cache_slots is not None and self.cache_slots < 1:
                raise EaglekitError(f"--cache-slots {self.cache_slots}", hint="give the slots per row, e.g. 4096")
            check_stop_loops(self.stop_loops, self.cache_slots)
            check_refill_padding(self.refill_padding)
            check_refill_capture_after(self.refill_capture_after)
            return
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                flag = "--" + f.name.replace("_", "-")
                raise EaglekitError(
                    f"{flag} {value} is a setting of eaglekit's engine, not of backend {backend!r}",
                    hint=f"drop {flag}, or use --backend local",
                )


def make_generator(
    backend: str,
    model,
    stop_ids: list[int],
    sampling: Sampling,
    *,
    seed: int = 0,
    batch_size: int = 32,
    engine: EngineSettings = EngineSettings(),
):
    """A token-level generator: `local` and `engine` are eaglekit's batch decoder (with `engine`'s
    settings), `hf` is HF generate."""
    engine.check(backend)
    if backend in ("local", "engine"):
        return EngineGenerator(
            model,
            stop_ids,
            sampling,
            seed=seed,
            batch_size=batch_size,
            attention=None if engine.attention == "auto" else engine.attention,
            max_len=engine.cache_slots,
            refill=engine.refill,
            refill_padding=engine.refill_padding,
            refill_capture_after=engine.refill_capture_after,
            stop_loops=engine.stop_loops,
        )
    if backend == "hf":
        return HFGenerator(model, stop_ids, sampling, seed=seed)
    raise EaglekitError(f"unknown local backend {backend!r}", hint="use local, engine or hf")
