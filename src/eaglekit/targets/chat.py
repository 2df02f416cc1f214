"""Render conversations with the target's own chat template and mask the assistant's tokens.

The mask is derived from the template itself, not from a registry per model family. For each
assistant turn i:

1. `P` = `messages[:i]` rendered with the generation prompt: what a serving engine sends the target
   before turn i; `F` = `messages[:i + 1]` rendered without the generation prompt.
2. In the whole conversation's rendering (the training text), the turn starts at `len(P)` when the
   text starts with `P`. Some templates render past turns differently from the turn being written
   (Qwen3 drops the <think> block of past turns, so with enable_thinking=False the history lacks the
   empty think block of the prompt): then the history before the turn must still render the same,
   the turn's header must be a prefix of the generation prompt, and the turn starts where its text
   starts, right after that header.
3. The turn ends with the first special token after its start: the end-of-turn token the model
   writes itself (e.g. <|im_end|>, <|eot_id|>, </s>, <end_of_turn>, <|end|>). It must also end the
   turn in `F` (the conversation cut right after the turn), so the next turn's header never passes
   for it. The answer (after any </think>) must appear verbatim before it.
4. Tokens: the text is cut where assistant turns start; each piece is tokenized on its own, as a
   serving engine tokenizes the prompt and appends the generated tokens. A piece holds the turn and
   the template text after it (tokenized together, as the next prompt is), so a special token that
   swallows the whitespace after it (rstrip, as in Phi-3) tokenizes as the engine sees it.

Loss mask 1 = a token the assistant wrote (its text and its end-of-turn token); 0 = everything the
template or the user wrote. A template or conversation that breaks these rules raises instead of
guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from eaglekit.errors import EaglekitError

ROLES = ("system", "user", "assistant")
NOT_EXACT = "this chat template cannot be masked exactly"


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token was written by the assistant


def check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise EaglekitError("empty conversation", hint="a conversation needs at least one user turn")
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise EaglekitError(
                f"message {n} is malformed: {str(m)[:80]!r}",
                hint="each message is {'role': system|user|assistant, 'content': str}",
            )


def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool, **template_kwargs) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise EaglekitError(
            "the target's tokenizer has no chat template",
            hint="use an instruct/chat model, or set tokenizer.chat_template (a .jinja file)",
        )
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
    except Exception as err:  # jinja raises TemplateError / its own exceptions (raise_exception)
        raise EaglekitError(
            f"the chat template refused this conversation: {err}",
            hint="check the role order the template allows (e.g. user/assistant alternation, no system role)",
        ) from err
    if not isinstance(text, str):
        raise EaglekitError(
            f"the chat template rendered {type(text).__name__}, not text",
            hint="pass plain messages [{'role': ..., 'content': str}]",
        )
    return text


def special_tokens(tokenizer) -> list[str]:
    """Strings of the tokenizer's special tokens (end-of-turn candidates), longest first."""
    found = set(tokenizer.all_special_tokens)
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(token, "special", False):
            found.add(str(token))
    return sorted((t for t in found if t), key=len, reverse=True)


def find_special(text: str, start: int, specials: list[str]) -> tuple[int, int] | None:
    """Position and end of the first special token at or after `start` (longest wins a tie)."""
    best = None
    for tok in specials:
        pos = text.find(tok, start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, pos + len(tok))
    return best


def find_end_of_turn(text: str, start: int, specials: list[str]) -> tuple[int, int]:
    """Position and end of the first special token at or after `start`; raises if there is none."""
    found = find_special(text, start, specials)
    if found is None:
        raise EaglekitError(
            "no end-of-turn special token follows an assistant turn in the rendered template", hint=NOT_EXACT
        )
    return found


def answer_text(content: str) -> str:
    """The part of an answer a template must reproduce verbatim (reasoning may be re-wrapped)."""
    return content.split("</think>")[-1].strip()


def common_prefix(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two strings or lists (slice compares in C: this runs
    once per turn on whole conversations, where a loop in Python cost seconds per thousand of them)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def history_start(full: str, history: str, prompt: str, expected: str, turn: int) -> int:
    """Start of assistant turn `turn` in `full` when the template renders it differently as history.

    `history` (the messages before the turn, no generation prompt) must begin `full` and `prompt`;
    the turn's header in `full` must be a prefix of the generation prompt `prompt[len(history):]`,
    and the turn's text must start right after it, at exactly one place.
    """
    if not (full.startswith(history) and prompt.startswith(history)):
        raise EaglekitError(
            f"the chat template renders the messages before assistant turn {turn} differently in the whole "
            "conversation than in that turn's prompt (it moves or drops earlier messages, e.g. the system "
            "message), so the turn's prompt is not in the training text",
            hint=f"{NOT_EXACT} for this conversation; drop the system message or fix the template",
        )
    generation_prompt = prompt[len(history) :]
    rest = full[len(history) :]
    common = common_prefix(generation_prompt, rest)
    # expected may begin with characters that coincide with the generation prompt's tail.
    starts = [j for j in range(common + 1) if expected and rest.startswith(expected, j)]
    if len(starts) != 1:
        raise EaglekitError(
            f"assistant turn {turn} is rendered differently as history than as the turn being written, "
            "and its text does not start right after a prefix of the generation prompt "
            f"{generation_prompt!r}",
            hint=f"{NOT_EXACT} for this conversation (e.g. reasoning in a past turn with thinking disabled)",
        )
    return len(history) + starts[0]


def assistant_spans(
    tokenizer, messages: list[dict], full: str, *, specials: list[str] | None = None, **template_kwargs
) -> list[tuple[int, int]]:
    """Character spans [start, end) of each assistant turn in `full`, end-of-turn token included.
    `specials`: `special_tokens(tokenizer)`, when the caller already has them."""
    specials = special_tokens(tokenizer) if specials is None else specials
    spans: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if i == 0:
            raise EaglekitError(
                "the conversation starts with an assistant turn, which has no prompt",
                hint="start with a user (or system) message",
            )
        expected = answer_text(message["content"])
        prompt = render(tokenizer, messages[:i], add_generation_prompt=True, **template_kwargs)
        if full.startswith(prompt):
            start = len(prompt)
        else:
            history = render(tokenizer, messages[:i], add_generation_prompt=False, **template_kwargs)
            start = history_start(full, history, prompt, expected, i)
        if spans and start < spans[-1][1]:
            raise EaglekitError(f"assistant turn {i} starts inside the previous assistant turn", hint=NOT_EXACT)
        eot = find_special(full, start, specials)
        if eot is not None and expected and expected not in full[start : eot[0]]:
            raise EaglekitError(
                f"assistant turn {i}'s text is not found verbatim between the generation prompt and the "
                f"end-of-turn token {full[eot[0] : eot[1]]!r}",
                hint=f"the template rewrites assistant text (or the text holds a special token); {NOT_EXACT}",
            )
        # The end-of-turn token must be the template's own end of this turn, not the next turn's header:
        # it must also end the turn when the conversation stops right after it.
        last = i + 1 == len(messages)  # the conversation cut after its last turn is the whole one
        alone = full if last else render(tokenizer, messages[: i + 1], add_generation_prompt=False, **template_kwargs)
        same = common_prefix(alone, full)
        if same < start:
            raise EaglekitError(
                f"the chat template renders the messages before assistant turn {i} differently when that turn "
                "is the last one",
                hint=f"{NOT_EXACT} for this conversation",
            )
        if eot is None or same < eot[1]:
            # The turn renders differently when it is the last one (Qwen3 adds the think block).
            own = find_special(alone, same, specials)
            if (
                eot is None
                or own is None
                or alone[own[0] : own[1]] != full[eot[0] : eot[1]]
                or expected not in alone[same : own[0]]
            ):
                raise EaglekitError(
                    f"no end-of-turn special token follows assistant turn {i} in the rendered template",
                    hint=f"{NOT_EXACT}: the model's end of turn must be a special token of the tokenizer",
                )
        spans.append((start, eot[1]))
    return spans


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """`tokenizer.encode(text, add_special_tokens=False)` of each text (an empty one: no ids), in one
    tokenizer call: a fast tokenizer runs the batch in Rust."""
    filled = [t for t in texts if t]
    ids = iter(tokenizer(filled, add_special_tokens=False, return_attention_mask=False)["input_ids"] if filled else ())
    return [next(ids) if t else [] for t in texts]


def conversation_texts(
    tokenizer, messages: list[dict], *, specials: list[str] | None = None, **template_kwargs
) -> list[str]:
    """The texts a conversation's tokens come from, cut where assistant turns start (see module doc):
    [before the first turn, then per assistant turn: its piece (the turn + template text up to the next
    turn), its written part (the turn alone, end-of-turn token included)].

    Raises:
        EaglekitError: no template, malformed messages, or a template that cannot be masked exactly.
    """
    check_messages(messages)
    full = render(tokenizer, messages, add_generation_prompt=False, **template_kwargs)
    spans = assistant_spans(tokenizer, messages, full, specials=specials, **template_kwargs)
    texts = [full[: spans[0][0] if spans else len(full)]]
    for n, (start, end) in enumerate(spans):
        piece_end = spans[n + 1][0] if n + 1 < len(spans) else len(full)
        texts += [full[start:piece_end], full[start:end]]
    return texts


def join_pieces(texts: list[str], encoded: list[list[int]], *, max_length: int | None = None) -> TokenizedConversation:
    """Ids and loss mask from `conversation_texts` and their `encode_texts`."""
    ids = list(encoded[0])
    mask = [0] * len(ids)
    for n in range(1, len(texts), 2):
        piece, written = encoded[n], encoded[n + 1]
        if piece[: len(written)] != written:
            raise EaglekitError(
                f"the tokenizer merges the end of assistant text {texts[n + 1][-40:]!r} with the text "
                "after it, so its tokens cannot be masked exactly",
                hint=NOT_EXACT,
            )
        ids += piece
        mask += [1] * len(written) + [0] * (len(piece) - len(written))
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return TokenizedConversation(input_ids=ids, loss_mask=mask)


def tokenize_conversation(
    tokenizer, messages: list[dict], *, max_length: int | None = None, **template_kwargs
) -> TokenizedConversation:
    """Token ids of a whole conversation rendered with the target's template, and its loss mask.

    Args:
        tokenizer: the target's tokenizer (with a chat template).
        messages: [{"role": "system"|"user"|"assistant", "content": str}, ...].
        max_length: truncate to this many tokens.
        template_kwargs: passed to `apply_chat_template` (e.g. enable_thinking=False).

    Raises:
        EaglekitError: no template, malformed messages, or a template that cannot be masked exactly.
    """
    texts = conversation_texts(tokenizer, messages, **template_kwargs)
    return join_pieces(texts, encode_texts(tokenizer, texts), max_length=max_length)


def prompt_ids(tokenizer, messages: list[dict], **template_kwargs) -> list[int]:
    """Token ids of a prompt ending with the generation prompt (what the target answers)."""
    check_messages(messages)
    text = render(tokenizer, messages, add_generation_prompt=True, **template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


# Two short turns: enough to show whether the template marks where each answer starts and ends.
MASK_PROBE = (
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "6."},
)


def check_template_masks(tokenizer, **template_kwargs) -> None:
    """Refuse a chat template whose assistant turns cannot be masked, before answers are paid for.

    Features, vocab and training learn only from the assistant's tokens; a template without
    assistant markers (or without an end-of-turn special token) would be refused by them after
    generation has run.
    """
    try:
        tokenized = tokenize_conversation(tokenizer, list(MASK_PROBE), **template_kwargs)
    except EaglekitError as err:
        raise EaglekitError(
            f"the target's chat template cannot mark the assistant's tokens: {err.message}",
            hint="training needs to know which tokens the assistant wrote: use the model's chat "
            "template (an instruct model), or fix it so each assistant turn ends with a "
            f"special token ({err.hint})",
        ) from err
    if not any(tokenized.loss_mask):
        raise EaglekitError(
            "the target's chat template marks no assistant token in a two-turn conversation",
            hint="use the model's chat template (an instruct model)",
        )
