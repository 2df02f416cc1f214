"""The two record types the data stages exchange, and the keys that deduplicate and split them.

A prompt (output of `eaglekit prompts`) is `{"id", "source", "turns": [user message, ...],
"system"?}`: only what the user says. A conversation (output of `eaglekit generate`) adds the
target's own answers: `{"id", "source", "split", "messages": [{"role", "content"}, ...], "meta"}`
where `split` is the prompt's split ("train" / "validation") and `meta` holds
`finish_reason` ("stop": every answer ended with the end-of-turn token; "length": one hit max new
tokens; "loop": one was ended by `generate --stop-loops`; "context_length": later turns did not fit the context and were dropped, see
`unanswered_turns`), `num_tokens` (generated tokens of all answers, end-of-turn tokens included)
and `turns` (`{"finish_reason", "num_tokens", "counted_by"}` per answer). `counted_by` says where
`num_tokens` comes from: "generator" (the token ids this machine generated), "server" (the
server's `usage.completion_tokens`) or "tokenizer" (the server reported no usage: the answer text
re-encoded with the target's tokenizer, plus the end-of-turn token when it stopped; an estimate,
since re-encoding need not give back the tokens the server sampled).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from eaglekit.artifacts import hash_share
from eaglekit.errors import EaglekitError

SPLITS = ("train", "validation")


class MalformedRecord(ValueError):
    """A record that does not fit the expected schema; the reader adds file and line."""


def check_unicode(text: str) -> None:
    """Refuse text that is not valid Unicode: a lone surrogate (JSON `"\\ud83d"`, half of an emoji)
    passes `json.loads` but breaks hashing, tokenizers and writing the file back."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise MalformedRecord(
            f"invalid Unicode: a lone surrogate {text[err.start]!r} at character {err.start} "
            "(half of an escaped emoji or other character)"
        ) from None


@dataclass
class Prompt:
    """User turns of one conversation; the target writes every answer."""

    id: str
    source: str
    turns: list[str]
    system: str | None = None

    def __post_init__(self) -> None:
        for text in (self.id, self.source, *self.turns, self.system):
            if isinstance(text, str):
                check_unicode(text)

    def to_json(self) -> dict:
        obj = {"id": self.id, "source": self.source, "turns": self.turns}
        if self.system is not None:
            obj["system"] = self.system
        return obj

    @classmethod
    def from_json(cls, obj: dict) -> "Prompt":
        """Parse a prompt line; raises MalformedRecord when a field is missing or mistyped."""
        if not isinstance(obj, dict):
            raise MalformedRecord(f"expected a JSON object, got {type(obj).__name__}")
        turns, system = obj.get("turns"), obj.get("system")
        if not isinstance(obj.get("id"), (str, int)) or not isinstance(obj.get("source"), str):
            raise MalformedRecord("needs 'id' (string) and 'source' (string)")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise MalformedRecord("'turns' must be a non-empty list of non-empty strings")
        if system is not None and not isinstance(system, str):
            raise MalformedRecord("'system' must be a string")
        return cls(id=str(obj["id"]), source=obj["source"], turns=list(turns), system=system)

    @property
    def num_chars(self) -> int:
        return sum(len(t) for t in self.turns) + len(self.system or "")

    def dedup_key(self) -> str:
        """Case- and whitespace-insensitive identity of the prompt's content (not its id or source)."""
        parts = [normalize(self.system or "")] + [normalize(t) for t in self.turns]
        return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()

    def messages(self, answers: list[str] | None = None) -> list[dict]:
        """Chat messages: system, then each user turn followed by its answer when known."""
        answers = answers or []
        out = [{"role": "system", "content": self.system}] if self.system is not None else []
        for i, turn in enumerate(self.turns):
            out.append({"role": "user", "content": turn})
            if i < len(answers):
                out.append({"role": "assistant", "content": answers[i]})
        return out


@dataclass
class Answer:
    """One assistant turn written by the target."""

    text: str
    finish_reason: str  # "stop" (end-of-turn token), "length" (max tokens reached) or "loop" (ended by --stop-loops)
    num_tokens: int  # tokens generated, the end-of-turn token included
    counted_by: str  # where num_tokens comes from: "generator", "server" or "tokenizer"
    prompt_tokens: int | None = None
    loop_tokens: int | None = None  # trailing tokens that repeat a loop (`data.quality.loop_tail`); None: not measured


@dataclass
class Conversation:
    """A prompt being answered turn by turn; done when every user turn has an answer."""

    prompt: Prompt
    split: str
    answers: list[Answer] = field(default_factory=list)
    skipped: str | None = None  # reason the remaining turns could not be answered

    @property
    def done(self) -> bool:
        return self.skipped is not None or len(self.answers) == len(self.prompt.turns)

    def next_messages(self) -> list[dict]:
        """The history the target sees before writing its next answer (ends with a user turn)."""
        n = len(self.answers)
        return self.prompt.messages([a.text for a in self.answers])[: n * 2 + 1 + (self.prompt.system is not None)]

    def to_json(self) -> dict:
        n = len(self.answers)
        turns = [
            {"finish_reason": a.finish_reason, "num_tokens": a.num_tokens, "counted_by": a.counted_by}
            | ({} if a.loop_tokens is None else {"loop_tokens": a.loop_tokens})
            for a in self.answers
        ]
        finish = next((r for r in ("length", "loop") if any(a.finish_reason == r for a in self.answers)), "stop")
        if self.skipped is not None:
            finish = "context_length"
        meta = {"finish_reason": finish, "num_tokens": sum(a.num_tokens for a in self.answers), "turns": turns}
        if n < len(self.prompt.turns):
            meta["unanswered_turns"] = len(self.prompt.turns) - n
        return {
            "id": self.prompt.id,
            "source": self.prompt.source,
            "split": self.split,
            "messages": self.prompt.messages([a.text for a in self.answers])[
                : n * 2 + (self.prompt.system is not None)
            ],
            "meta": meta,
        }


_SPACE = re.compile(r"\s+")


def normalize(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def split_of(prompt: Prompt, validation_fraction: float, seed: int = 0) -> str:
    """'train' or 'validation' from a hash of the prompt's content: stable across reruns and mixes."""
    if not 0.0 <= validation_fraction < 1.0:
        raise EaglekitError(
            f"validation fraction {validation_fraction} is outside [0, 1)",
            hint="use e.g. 0.02 for 2 % validation prompts",
        )
    return "validation" if hash_share(f"split:{seed}:{prompt.dedup_key()}", validation_fraction) else "train"


def order_key(prompt: Prompt, seed: int) -> str:
    """Deterministic pseudo-random order (for sampling a share of a source and interleaving mixes)."""
    return hashlib.sha256(f"order:{seed}:{prompt.source}:{prompt.id}:{prompt.dedup_key()}".encode()).hexdigest()
