"""Measurement: every prompt (every turn) with HF `generate`, plain decoding and speculation.

All three see the same token ids; turn 2 follows the target's own turn-1 answer (the engine's
plain output). Plain decoding and speculation run in the same engine (same runner, same cache,
same graphs); HF `generate` (greedy, same max tokens, same stop ids) is what a user would otherwise
run. Timing wraps each generation with device syncs; warm-up runs are not recorded.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field, replace

import torch

from eaglekit.data.records import Prompt
from eaglekit.engine.generate import Engine, Generation
from eaglekit.targets.chat import prompt_ids

log = logging.getLogger(__name__)


@dataclass
class Turn:
    """One generation request of the benchmark and what each method produced for it."""

    prompt_id: str
    turn: int
    ids: list[int]
    plain: Generation
    hf: Generation | None = None
    spec: dict[str, Generation] = field(default_factory=dict)  # by speculation label


def conversation_ids(tokenizer, prompt: Prompt, answers: list[str]) -> list[list[int]]:
    """Token ids of each turn's request: history (with the given answers) + the new user turn."""
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    out = []
    for i, text in enumerate(prompt.turns):
        messages.append({"role": "user", "content": text})
        out.append(prompt_ids(tokenizer, messages))
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return out


def answer_text(tokenizer, tokens: list[int], stop_ids: set[int]) -> str:
    return tokenizer.decode([t for t in tokens if t not in stop_ids], skip_special_tokens=True).strip()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def hf_generate(model, ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> Generation:
    """HF `generate`, greedy, as a user would call it; tokens cut after the first stop token."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], device=device)
    sync(device)
    start = time.perf_counter()
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(stop_ids) or None,
        pad_token_id=(list(stop_ids) or [0])[0],
    )
    sync(device)
    seconds = time.perf_counter() - start
    tokens = out[0, len(ids) :].tolist()
    stops = set(stop_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return Generation(tokens=tokens[: i + 1], finish_reason="stop", seconds=seconds)
    return Generation(tokens=tokens, finish_reason="length", seconds=seconds)


@dataclass
class Method:
    """A speculation setting the bench measures: its label, its engine and (for `oracle`) the drafter
    to hand each turn's reference."""

    label: str
    engine: Engine
    oracle: object | None = None
    plain_fallback: bool | None = None  # None: as the engine's spec says; False: speculate throughout


def run_turns(
    plain: Engine,
    methods: list[Method],
    target,
    prompts: list[Prompt],
    *,
    max_new_tokens: int,
    hf: bool,
    hf_prompts: int,
    seed: int | None,
    warmup: int = 1,
) -> tuple[list[Turn], dict]:
    """Every turn by every method, interleaved turn by turn: HF generate (the first `hf_prompts`
    prompts only, 0: all; it is tens of times slower), plain decoding, each speculation setting, plain again.
    Turn k+1 follows the plain turn-k answer. Interleaved, a machine whose speed drifts during the
    bench slows every method alike instead of the ones that ran last (two identical benches once
    disagreed widely when whole passes ran one after another: docs/notes/engine.md, "The bench's
    order"); the plain run after the speculative ones brackets them, and how far the two plain runs
    of a turn differ is reported (`bracket`)."""
    tokenizer, stops = target.tokenizer, target.stop_token_ids
    warm_up(
        plain,
        methods,
        target,
        conversation_ids(tokenizer, prompts[0], [])[0],
        max_new_tokens=max_new_tokens,
        hf=hf,
        seed=seed,
        warmup=warmup,
    )
    turns: list[Turn] = []
    again: list[Generation] = []
    for n, prompt in enumerate(prompts):
        answers: list[str] = []
        with_hf = hf and (not hf_prompts or n < hf_prompts)
        for k in range(len(prompt.turns)):
            ids = conversation_ids(tokenizer, prompt, answers)[k]
            turn = Turn(
                prompt_id=prompt.id,
                turn=k,
                ids=ids,
                hf=hf_generate(target.model, ids, max_new_tokens, stops) if with_hf else None,
                plain=plain.generate(ids, max_new_tokens, speculative=False, seed=seed),
            )
            for method in methods:
                speculate(method, turn, max_new_tokens=max_new_tokens, seed=seed)
            again.append(plain.generate(ids, max_new_tokens, speculative=False, seed=seed))
            turns.append(turn)
            answers.append(answer_text(tokenizer, turn.plain.tokens, set(stops)))
            log.info(
                "%s turn %d: %d tokens, plain %.1f tok/s%s%s",
                prompt.id,
                k,
                len(turn.plain.tokens),
                len(turn.plain.tokens) / turn.plain.seconds,
                f", HF generate {len(turn.hf.tokens) / turn.hf.seconds:.1f} tok/s" if turn.hf else "",
                "".join(
                    f", [{label}] tau {g.tau:.2f} {len(g.tokens) / g.seconds:.1f} tok/s"
                    for label, g in turn.spec.items()
                ),
            )
    return turns, bracket(turns, again)


def warm_up(
    plain: Engine,
    methods: list[Method],
    target,
    ids: list[int],
    *,
    max_new_tokens: int,
    hf: bool,
    seed: int | None,
    warmup: int,
) -> None:
    """Untimed runs of every method first (compiles, graph captures, allocator)."""
    reference: list[int] = []
    for _ in range(warmup):
        reference = plain.generate(ids, max_new_tokens, speculative=False, seed=seed).tokens
        if hf:
            hf_generate(target.model, ids, max_new_tokens, target.stop_token_ids)
        for method in methods:
            if method.oracle is not None:
                method.oracle.set_reference(ids + reference)
            method.engine.generate(ids, max_new_tokens, seed=seed, plain_fallback=method.plain_fallback)


ORACLE_ROUNDS = 3


def settle_oracle(
    engine: Engine, oracle, ids: list[int], reference: list[int], max_new_tokens: int, seed: int | None = None
) -> tuple[list[int], int]:
    """The continuation the oracle must replay to be accepted in full, and the rounds it took.

    In bf16 the verify forward (many tokens) can round a near-tie differently from plain decoding
    (one token): the speculative output then leaves the plain answer and an oracle replaying that
    answer is wrong from there on, which would charge the engine for a numerical detail. Each round
    replays the previous round's own output; a path's logits depend only on its own tokens, so this
    settles in one or two rounds. In fp32 the plain answer is already the fixed point.
    """
    for rounds in range(1, ORACLE_ROUNDS + 1):
        oracle.set_reference(ids + reference)
        out = engine.generate(ids, max_new_tokens, seed=seed).tokens
        if out == reference:
            return reference, rounds
        reference = out
    log.warning("the oracle did not settle in %d rounds: its accept length understates the engine", ORACLE_ROUNDS)
    return reference, ORACLE_ROUNDS


def speculate(method: Method, turn: Turn, *, max_new_tokens: int, seed: int | None) -> None:
    """One turn with speculative decoding (the oracle replays the settled plain answer)."""
    if method.oracle is not None:
        reference, rounds = settle_oracle(
            method.engine, method.oracle, turn.ids, turn.plain.tokens, max_new_tokens, seed
        )
        method.oracle.set_reference(turn.ids + reference)
        if rounds > 1:
            log.info("%s turn %d: oracle settled after %d rounds", turn.prompt_id, turn.turn, rounds)
    turn.spec[method.label] = method.engine.generate(
        turn.ids, max_new_tokens, seed=seed, plain_fallback=method.plain_fallback
    )


# Plain decoding this much faster or slower after the speculative runs than before: ratios untrustworthy.
DRIFT_WARN = 0.10


def bracket(turns: list[Turn], again: list[Generation]) -> dict:
    """Each turn's baseline: the mean of its plain run before the speculative ones and the one after.

    `drift`: how far the two plain runs of a turn differ (the median over turns; or the two passes'
    totals, if wider). On a loaded machine it says how far the ratios can be trusted.
    """
    gaps = []
    for turn, run in zip(turns, again):
        a, b = len(turn.plain.tokens) / max(turn.plain.seconds, 1e-9), len(run.tokens) / max(run.seconds, 1e-9)
        gaps.append(abs(a - b) / max(min(a, b), 1e-9))
    before = sum(len(t.plain.tokens) for t in turns) / max(sum(t.plain.seconds for t in turns), 1e-9)
    after = sum(len(r.tokens) for r in again) / max(sum(r.seconds for r in again), 1e-9)
    for turn, run in zip(turns, again):
        turn.plain = replace(turn.plain, seconds=(turn.plain.seconds + run.seconds) / 2)
    drift = max(statistics.median(gaps) if gaps else 0.0, abs(after - before) / max(min(before, after), 1e-9))
    timing = {
        "plain_tok_s_before": round(before, 2),
        "plain_tok_s_after": round(after, 2),
        "drift": round(drift, 3),
        "baseline": "each turn: the mean of its plain run before and the one after its speculative runs, "
        "all interleaved turn by turn",
    }
    if drift > DRIFT_WARN:
        timing["warning"] = (
            f"a turn's two plain runs (before and after its speculative ones) differ by "
            f"{drift:.0%} (median; {before:.1f} against {after:.1f} tok/s over all turns): the "
            "machine's speed changed during the bench, so its speedups are not trustworthy; "
            "rerun on a quiet machine"
        )
        log.warning(timing["warning"])
    return timing
