"""A chat family's expected loss masks: `check_masks` tokenizes a conversation and checks that each
assistant turn is one masked run holding exactly what the model writes (tests/*/test_chat.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from eaglekit.targets.chat import prompt_ids, tokenize_conversation


@dataclass
class Family:
    template: str
    specials: list[str]  # special added tokens
    bos: str | None
    eos: str
    written: Callable[[str, bool, dict], str]  # (answer, is_last_turn, template kwargs) -> model-written text
    rstrip: list[str] = field(default_factory=list)  # special tokens that swallow whitespace after them
    plain: list[str] = field(default_factory=list)  # non-special added tokens
    system: str = "ok"  # "ok" | "refused" (template raises) | "unmaskable"


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


Q1 = {"role": "user", "content": "What is the capital of France?"}


A1 = {"role": "assistant", "content": "The capital of France is Paris."}


Q2 = {"role": "user", "content": "Count from one to ten, café ☕."}


A2 = {"role": "assistant", "content": "1 2 3 4 5 6 7 8 9 10.\nDone!"}


CONVERSATIONS = {
    "single": [Q1, A1],
    "multi": [Q1, A1, Q2, A2],
    "system_single": [SYSTEM, Q1, A1],
    "system_multi": [SYSTEM, Q1, A1, Q2, A2],
    "ends_with_user": [Q1, A1, Q2],
}


def runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """Contiguous runs of masked ids."""
    out: list[list[int]] = []
    for n, (token, flag) in enumerate(zip(ids, mask)):
        if flag:
            if n == 0 or not mask[n - 1]:
                out.append([])
            out[-1].append(token)
    return out


def check_masks(tok, messages: list[dict], family: Family, **kwargs) -> None:
    result = tokenize_conversation(tok, messages, **kwargs)
    ids, mask = result.input_ids, result.loss_mask
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    full = tok.apply_chat_template(messages, tokenize=False, **kwargs)
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    last_query = max(i for i, m in enumerate(messages) if m["role"] == "user")
    expected = [
        family.written(m["content"].split("</think>")[-1].lstrip("\n"), i > last_query, kwargs)
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
    ]
    # Each assistant turn is one masked run: exactly what the model writes, nothing of headers/user/system.
    assert [tok.decode(run) for run in runs(ids, mask)] == expected
    unmasked = tok.decode([t for t, f in zip(ids, mask) if not f])
    for m in messages:
        if m["role"] != "assistant":
            assert m["content"].strip() in unmasked
    for answer in answers:
        assert answer.split("</think>")[-1].strip() not in unmasked
    # All ids give back the rendered text (a token that strips the whitespace after it drops that whitespace).
    round_trip = tok.decode(tok.encode(full, add_special_tokens=False)) if family.rstrip else full
    assert tok.decode(ids) == round_trip
    if "bos_token" in tok.chat_template:
        assert full.startswith(tok.bos_token)
    if len(answers) == 1 and messages[-1]["role"] == "assistant":
        first = mask.index(1)
        assert ids[:first] == prompt_ids(tok, messages[:-1], **kwargs)
