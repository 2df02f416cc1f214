"""Measurement: every prompt (every turn) with HF `generate`, plain decoding and speculation.

All three see the same token ids; turn 2 follows the target's own turn-1 answer (the engine's
plain output). Plain decoding and speculation run in the same engine (same runner, same cache,
same graphs); HF `generate` (greedy, same max tokens, same stop ids) is what a user would otherwise
run. Timing wraps each generation with device syncs; warm-up runs are not recorded.
"""

from __future__ import annotations

import logging
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
    spec: dict[str, Generation] = field(default_factory=dict)   # by speculation label


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
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=list(stop_ids) or None, pad_token_id=(list(stop_ids) or [0])[0])
    sync(device)
    seconds = time.perf_counter() - start
    tokens = out[0, len(ids):].tolist()
    stops = set(stop_ids)
    for i, t in enumerate(tokens):
        if t in stops:
            return Generation(tokens=tokens[:i + 1], finish_reason="stop", seconds=seconds)
    return Generation(tokens=tokens, finish_reason="length", seconds=seconds)


def run_baselines(engine: Engine, target, prompts: list[Prompt], *, max_new_tokens: int, hf: bool,
                  seed: int | None, warmup: int = 1, hf_prompts: int | None = None) -> list[Turn]:
    """Plain decoding of every turn (and HF generate of the first `hf_prompts` prompts' turns: HF is
    tens of times slower, so a whole benchmark's worth would dominate the run); turn k+1 follows the
    plain turn-k answer."""
    tokenizer, stops = target.tokenizer, target.stop_token_ids
    first = conversation_ids(tokenizer, prompts[0], [])[0]
    for _ in range(warmup):
        engine.generate(first, max_new_tokens, speculative=False, seed=seed)
        if hf:
            hf_generate(target.model, first, max_new_tokens, stops)
    turns: list[Turn] = []
    for n, prompt in enumerate(prompts):
        answers: list[str] = []
        with_hf = hf and (hf_prompts is None or n < hf_prompts)
        for k in range(len(prompt.turns)):
            ids = conversation_ids(tokenizer, prompt, answers)[k]
            turn = Turn(prompt_id=prompt.id, turn=k, ids=ids,
                        hf=hf_generate(target.model, ids, max_new_tokens, stops) if with_hf else None,
                        plain=engine.generate(ids, max_new_tokens, speculative=False, seed=seed))
            turns.append(turn)
            answers.append(answer_text(tokenizer, turn.plain.tokens, set(stops)))
            log.info("%s turn %d: %d tokens plain %.1f tok/s%s", prompt.id, k, len(turn.plain.tokens),
                     len(turn.plain.tokens) / turn.plain.seconds,
                     f", HF generate {len(turn.hf.tokens) / turn.hf.seconds:.1f} tok/s" if turn.hf else "")
    return turns


ORACLE_ROUNDS = 3


def settle_oracle(engine: Engine, oracle, ids: list[int], reference: list[int], max_new_tokens: int,
                  seed: int | None = None) -> tuple[list[int], int]:
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


def run_speculation(engine: Engine, turns: list[Turn], label: str, *, max_new_tokens: int, seed: int | None,
                    oracle=None, warmup: int = 1) -> None:
    """Speculative decoding of every recorded turn (the oracle replays the settled plain answer)."""
    for _ in range(warmup):
        if oracle is not None:
            oracle.set_reference(turns[0].ids + turns[0].plain.tokens)
        engine.generate(turns[0].ids, max_new_tokens, seed=seed)
    for turn in turns:
        if oracle is not None:
            reference, rounds = settle_oracle(engine, oracle, turn.ids, turn.plain.tokens, max_new_tokens, seed)
            oracle.set_reference(turn.ids + reference)
            if rounds > 1:
                log.info("%s turn %d: oracle settled after %d rounds", turn.prompt_id, turn.turn, rounds)
        gen = engine.generate(turn.ids, max_new_tokens, seed=seed)
        turn.spec[label] = gen
        log.info("%s turn %d [%s]: tau %.2f, %.1f tok/s", turn.prompt_id, turn.turn, label, gen.tau,
                 len(gen.tokens) / gen.seconds)


# Plain decoding this much faster or slower after the speculative runs than before: ratios untrustworthy.
DRIFT_WARN = 0.10


def bracket_plain(engine: Engine, turns: list[Turn], *, max_new_tokens: int, seed: int | None) -> dict:
    """Time plain decoding of every turn again, after the speculative runs.

    On a loaded machine the speed drifts between passes (two identical benches once gave 0.89x and
    0.60x). The plain runs before and after bracket the speculative ones in time, so each turn's
    baseline becomes the mean of the two; how far the two passes differ says how far the ratios
    can be trusted.
    """
    before_s = after_s = 0.0
    before_tokens = after_tokens = 0
    for turn in turns:
        again = engine.generate(turn.ids, max_new_tokens, speculative=False, seed=seed)
        before_s, before_tokens = before_s + turn.plain.seconds, before_tokens + len(turn.plain.tokens)
        after_s, after_tokens = after_s + again.seconds, after_tokens + len(again.tokens)
        turn.plain = replace(turn.plain, seconds=(turn.plain.seconds + again.seconds) / 2)
    before, after = before_tokens / max(before_s, 1e-9), after_tokens / max(after_s, 1e-9)
    drift = abs(after - before) / max(min(before, after), 1e-9)
    timing = {"plain_tok_s_before": round(before, 2), "plain_tok_s_after": round(after, 2), "drift": round(drift, 3),
              "baseline": "mean of the plain pass before and the one after the speculative runs"}
    if drift > DRIFT_WARN:
        timing["warning"] = (f"plain decoding ran at {before:.1f} tok/s before the speculative runs and {after:.1f} "
                             f"after ({drift:.0%} apart): the machine's speed changed during the bench, so its "
                             "speedups are not trustworthy; rerun on a quiet machine")
        log.warning(timing["warning"])
    return timing
