"""Render conversations with the target's own chat template and mask the assistant's tokens.

The mask is derived from the template itself, not from a registry per model family:

1. render the whole conversation once (what the target sees in training);
2. for each assistant turn i, render `messages[:i]` with the generation prompt: its length is where
   the assistant starts writing;
3. the turn ends with the first special token after that point (the end-of-turn token the model
   writes itself, e.g. <|im_end|>, <|eot_id|>, </s>, <end_of_turn>, <|end|>);
4. each piece (template text / assistant text) is tokenized on its own, as a serving engine
   tokenizes the prompt and then appends the generated tokens.

Loss mask 1 = a token the assistant wrote (its text and its end-of-turn token); 0 = everything the
template or the user wrote. A template that breaks these rules raises instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglekit.errors import EaglekitError

ROLES = ("system", "user", "assistant")


@dataclass
class TokenizedConversation:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token was written by the assistant

    @property
    def num_assistant_tokens(self) -> int:
        return sum(self.loss_mask)


def check_messages(messages: list[dict]) -> None:
    if not messages:
        raise EaglekitError("empty conversation", hint="a conversation needs at least one user turn")
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise EaglekitError(f"message {n} is malformed: {str(m)[:80]!r}",
                                hint="each message is {'role': system|user|assistant, 'content': str}")


def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool, **template_kwargs) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise EaglekitError("the target's tokenizer has no chat template",
                            hint="use an instruct/chat model, or set tokenizer.chat_template (a .jinja file)")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=add_generation_prompt, **template_kwargs)
    except Exception as err:  # jinja raises TemplateError / its own exceptions (raise_exception)
        raise EaglekitError(f"the chat template refused this conversation: {err}",
                            hint="check the role order the template allows (e.g. user/assistant alternation)") from err


def special_tokens(tokenizer) -> list[str]:
    """Strings of the tokenizer's special tokens (end-of-turn candidates), longest first."""
    found = set(tokenizer.all_special_tokens)
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(token, "special", False):
            found.add(str(token))
    return sorted((t for t in found if t), key=len, reverse=True)


def find_end_of_turn(text: str, start: int, specials: list[str]) -> tuple[int, int]:
    """Position and end of the first special token at or after `start`."""
    best = None
    for tok in specials:
        pos = text.find(tok, start)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, pos + len(tok))
    if best is None:
        raise EaglekitError("no end-of-turn special token follows an assistant turn in the rendered template",
                            hint="this chat template cannot be masked exactly")
    return best


def answer_text(content: str) -> str:
    """The part of an answer a template must reproduce verbatim (reasoning may be re-wrapped)."""
    return content.split("</think>")[-1].strip()


def assistant_spans(tokenizer, messages: list[dict], full: str, **template_kwargs) -> list[tuple[int, int]]:
    """Character spans [start, end) of each assistant turn in `full`, end-of-turn token included."""
    specials = special_tokens(tokenizer)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = render(tokenizer, messages[:i], add_generation_prompt=True, **template_kwargs) if i else ""
        if not full.startswith(prefix):
            raise EaglekitError(
                f"the chat template renders the history before assistant turn {i} differently once the turn "
                "is added, so the assistant's start cannot be located exactly",
                hint="this chat template cannot be masked exactly; fix the template or drop multi-turn data")
        start = len(prefix)
        eot_start, eot_end = find_end_of_turn(full, start, specials)
        expected = answer_text(message["content"])
        if expected and expected not in full[start:eot_start]:
            raise EaglekitError(
                f"assistant turn {i}'s text is not found verbatim between the generation prompt and the "
                f"end-of-turn token {full[eot_start:eot_end]!r}",
                hint="the template rewrites assistant text (or the text holds a special token); it cannot be masked exactly")
        spans.append((start, eot_end))
    return spans


def tokenize_conversation(tokenizer, messages: list[dict], *, max_length: int | None = None,
                          **template_kwargs) -> TokenizedConversation:
    """Token ids of a whole conversation rendered with the target's template, and its loss mask.

    Args:
        tokenizer: the target's tokenizer (with a chat template).
        messages: [{"role": "system"|"user"|"assistant", "content": str}, ...].
        max_length: truncate to this many tokens.
        template_kwargs: passed to `apply_chat_template` (e.g. enable_thinking=False).

    Raises:
        EaglekitError: no template, malformed messages, or a template that cannot be masked exactly.
    """
    check_messages(messages)
    full = render(tokenizer, messages, add_generation_prompt=False, **template_kwargs)
    spans = assistant_spans(tokenizer, messages, full, **template_kwargs)
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in spans + [(len(full), len(full))]:
        for text, flag in ((full[cursor:start], 0), (full[start:end], 1)):
            if text:
                piece = tokenizer.encode(text, add_special_tokens=False)
                ids += piece
                mask += [flag] * len(piece)
        cursor = end
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return TokenizedConversation(input_ids=ids, loss_mask=mask)


def prompt_ids(tokenizer, messages: list[dict], **template_kwargs) -> list[int]:
    """Token ids of a prompt ending with the generation prompt (what the target answers)."""
    check_messages(messages)
    text = render(tokenizer, messages, add_generation_prompt=True, **template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)
