"""Prompts written by the target itself (Magpie): for users with no data, or too little.

The target's chat template is rendered for a conversation whose only user message is a sentinel
string; the text before the sentinel is the *pre-query template* (for ChatML:
`<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n`). Fed that, an aligned model writes what a
user would ask, and stops at the template's end-of-user-turn token (the first special token after
the sentinel). The questions are sampled, deduplicated (also against an existing prompt set being
topped up) and kept until the target count is reached.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass

from eaglekit.data.options import GenerateOptions, SynthesizeOptions
from eaglekit.data.prompts import write_prompt_folder
from eaglekit.data.records import SPLITS, Prompt, split_of
from eaglekit.errors import EaglekitError
from eaglekit.targets.chat import find_end_of_turn, render, special_tokens

log = logging.getLogger(__name__)
SENTINEL = "EAGLEKIT_SENTINEL_7f3a9c"


@dataclass(frozen=True)
class PreQuery:
    """The template text up to where the user's message starts, and the token that ends it."""

    text: str
    end_of_turn: str
    end_of_turn_id: int


def pre_query_template(tokenizer, system: str | None = None, **template_kwargs) -> PreQuery:
    """Derive the pre-query template from the target's own chat template (no per-model table)."""
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": SENTINEL}
    ]
    text = render(tokenizer, messages, add_generation_prompt=False, **template_kwargs)
    if text.count(SENTINEL) != 1:
        raise EaglekitError(
            "the chat template does not render the user's message verbatim",
            hint="this template cannot be used for synthesis; provide prompts instead",
        )
    prefix, suffix = text.split(SENTINEL)
    try:
        start, end = find_end_of_turn(suffix, 0, special_tokens(tokenizer))
    except EaglekitError:
        raise EaglekitError(
            "no special token ends the user's turn in the chat template, so the end of a "
            "synthesized question cannot be recognised",
            hint="this template cannot be used for synthesis; provide prompts instead",
        ) from None
    if suffix[:start].strip():
        raise EaglekitError(
            f"the chat template writes {suffix[:start]!r} between the user's text and {suffix[start:end]!r}",
            hint="this template cannot be used for synthesis",
        )
    token = suffix[start:end]
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise EaglekitError(
            f"end-of-turn {token!r} is not a single token", hint="this template cannot be used for synthesis"
        )
    return PreQuery(text=prefix, end_of_turn=token, end_of_turn_id=int(token_id))


def synthesize(
    tokenizer,
    generator,
    pre_query: PreQuery,
    num_prompts: int,
    *,
    existing: list[Prompt] = (),
    batch_size: int = GenerateOptions.batch_size,
    max_new_tokens: int = SynthesizeOptions.max_new_tokens,
    min_chars: int = SynthesizeOptions.min_chars,
    max_attempts: int | None = None,
    system: str | None = None,
) -> tuple[list[Prompt], dict]:
    """Sample questions from the target until `num_prompts` new unique ones are found.

    Args:
        tokenizer: the target's tokenizer.
        generator: a token-level generator (sampling settings are its own) whose stop ids include
            `pre_query.end_of_turn_id`.
        pre_query: from `pre_query_template`.
        num_prompts: how many new prompts to return.
        existing: prompts already held (topping up): new ones must differ from them.
        batch_size: questions sampled per generation call.
        max_new_tokens: a question longer than this is dropped as unfinished.
        min_chars: shorter questions are dropped.
        max_attempts: samples drawn at most (default 4 x num_prompts + one batch).
        system: the system prompt the questions were written under, recorded with each prompt.

    Returns:
        The new prompts and counts of what was dropped and why.
    """
    if pre_query.end_of_turn_id not in generator.stop_ids:
        raise EaglekitError(
            "the generator does not stop at the end of the user's turn",
            hint="build it with the pre-query end-of-turn id among its stop ids",
        )
    ids = tokenizer.encode(pre_query.text, add_special_tokens=False)
    seen = {p.dedup_key() for p in existing}
    max_attempts = max_attempts or 4 * num_prompts + batch_size
    found: list[Prompt] = []
    stats = Counter(attempts=0, unfinished=0, too_short=0, duplicates=0)
    while len(found) < num_prompts and stats["attempts"] < max_attempts:
        n = min(batch_size, max_attempts - stats["attempts"])
        for completion in generator.generate([ids] * n, max_new_tokens):
            stats["attempts"] += 1
            if completion.finish_reason != "stop":
                stats["unfinished"] += 1
                continue
            text = tokenizer.decode(
                completion.token_ids[:-1], skip_special_tokens=True, clean_up_tokenization_spaces=False
            ).strip()
            prompt = Prompt(id="", source="magpie", turns=[text], system=system)
            if len(text) < min_chars:
                stats["too_short"] += 1
            elif (key := prompt.dedup_key()) in seen:
                stats["duplicates"] += 1
            elif len(found) < num_prompts:
                seen.add(key)
                prompt.id = f"magpie-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
                found.append(prompt)
        log.info("synthesized %d/%d prompts (%d samples drawn)", len(found), num_prompts, stats["attempts"])
    stats["synthesized"] = len(found)
    if len(found) < num_prompts:
        log.warning(
            "only %d of %d prompts after %d samples (%s); raise --temperature or --max-attempts",
            len(found),
            num_prompts,
            stats["attempts"],
            dict(stats),
        )
    return found, dict(stats)


def write_synthesized(
    out,
    new: list[Prompt],
    *,
    existing: dict[str, list[Prompt]] | None,
    stats: dict,
    config: dict,
    target_fp: dict,
    inputs: dict,
    validation_fraction: float,
    seed: int,
    overwrite: bool,
) -> dict:
    """Write the new prompts (plus the existing ones when topping up) as a prompts folder."""
    by_split = {s: list((existing or {}).get(s, [])) for s in SPLITS}
    for prompt in new:
        by_split[split_of(prompt, validation_fraction, seed)].append(prompt)
    counts = {
        "train": len(by_split["train"]),
        "validation": len(by_split["validation"]),
        "existing": sum(len(v) for v in (existing or {}).values()),
        "synthesis": stats,
        "malformed": 0,
    }
    return write_prompt_folder(
        out,
        by_split,
        config=config,
        inputs=inputs,
        counts=counts,
        target=target_fp,
        overwrite=overwrite,
        extra={"synthesized_by": target_fp},
    )
