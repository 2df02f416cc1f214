"""Record schemas of the prompt datasets people have, turned into `Prompt`s.

Only the user side is kept: answers already in a dataset are dropped, because the target must
write its own (EAGLE-3 drafts learn the target's distribution, not another model's).

| format   | record                                                                  |
| -------- | ----------------------------------------------------------------------- |
| turns    | `{"id"?, "source"?, "turns": [str, ...], "system"?}` (eaglekit, MT-bench question.jsonl) |
| sharegpt | `{"id"?, "conversations": [{"from": human|gpt|system, "value"}, ...]}`  |
| openai   | `{"id"?, "messages": [{"role": user|assistant|system, "content"}, ...]}` |
| alpaca   | `{"instruction", "input"?, "output"?}` (instruction + blank line + input) |
| prompt   | `{"prompt": str}` or any string column named with `column=`              |
| text     | one prompt per line of a plain-text file (or a JSON list of strings)    |
"""

from __future__ import annotations

from typing import Any

from eaglekit.data.records import MalformedRecord, Prompt
from eaglekit.errors import EaglekitError

FORMATS = ("auto", "turns", "sharegpt", "openai", "alpaca", "prompt", "text")
# ShareGPT speaker names seen in the wild, mapped to chat roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


def detect_format(record: Any) -> str:
    """The format of one record, from the keys it has."""
    if not isinstance(record, dict):
        raise MalformedRecord(f"expected a JSON object, got {type(record).__name__}")
    for key, fmt in (
        ("turns", "turns"),
        ("conversations", "sharegpt"),
        ("messages", "openai"),
        ("instruction", "alpaca"),
        ("prompt", "prompt"),
    ):
        if key in record:
            return fmt
    raise MalformedRecord(
        f"unknown record layout (keys {sorted(record)[:8]}); expected one of "
        "turns / conversations / messages / instruction / prompt"
    )


def to_prompt(record: Any, *, fmt: str, source: str, index: int, column: str | None = None) -> Prompt:
    """Turn one raw record into a Prompt.

    Args:
        record: the parsed JSON object (or a string for `text`).
        fmt: one of FORMATS.
        source: name of the source (used when the record carries none, and in generated ids).
        index: position of the record in its file, for ids of records that have none.
        column: the string field holding the prompt (format `prompt`).

    Raises:
        MalformedRecord: the record does not fit the format.
    """
    if fmt == "text" or (fmt == "auto" and isinstance(record, str)):  # a JSON list of strings too
        if not isinstance(record, str) or not record.strip():
            raise MalformedRecord("empty line")
        return Prompt(id=f"{source}-{index}", source=source, turns=[record.strip()])
    if column is not None and fmt in ("auto", "prompt"):
        fmt = "prompt"
    elif fmt == "auto":
        fmt = detect_format(record)
    if not isinstance(record, dict):
        raise MalformedRecord(f"expected a JSON object, got {type(record).__name__}")
    parse = {"turns": _turns, "sharegpt": _sharegpt, "openai": _openai, "alpaca": _alpaca, "prompt": _prompt}.get(fmt)
    if parse is None:
        raise EaglekitError(f"unknown prompt format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    turns, system = parse(record, column or "prompt")
    rid = record.get("id", record.get("question_id", f"{source}-{index}"))
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise MalformedRecord(f"'id' must be a string or integer, got {type(rid).__name__}")
    rsource = record.get("source") if isinstance(record.get("source"), str) else source
    return Prompt(id=str(rid), source=rsource, turns=turns, system=system)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedRecord(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise MalformedRecord(f"{what} is empty")
    return value


def _turns(record: dict, _column: str) -> tuple[list[str], str | None]:
    turns = record["turns"]
    if not isinstance(turns, list) or not turns:
        raise MalformedRecord("'turns' must be a non-empty list of strings")
    system = record.get("system")
    return (
        [_text(t, f"turns[{i}]") for i, t in enumerate(turns)],
        None if system is None else _text(system, "'system'"),
    )


def _chat(
    messages: Any, role_key: str, content_key: str, roles: dict[str, str] | None, field: str
) -> tuple[list[str], str | None]:
    """User turns and system prompt of a chat; leading assistant turns (greetings) are dropped."""
    if not isinstance(messages, list) or not messages:
        raise MalformedRecord(f"'{field}' must be a non-empty list")
    turns: list[str] = []
    system = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or role_key not in message or content_key not in message:
            raise MalformedRecord(f"{field}[{i}] needs '{role_key}' and '{content_key}'")
        name = message[role_key]
        role = roles.get(str(name).lower()) if roles else name
        if role not in ("system", "user", "assistant"):
            raise MalformedRecord(f"{field}[{i}] has unsupported role {name!r}")
        if role == "system":
            if turns or system is not None:
                raise MalformedRecord(f"{field}[{i}]: a system message may only come first")
            system = _text(message[content_key], f"{field}[{i}].{content_key}")
        elif role == "user":
            turns.append(_text(message[content_key], f"{field}[{i}].{content_key}"))
    if not turns:
        raise MalformedRecord(f"'{field}' holds no user message")
    return turns, system


def _sharegpt(record: dict, _column: str) -> tuple[list[str], str | None]:
    conv = record["conversations"]
    # Some ShareGPT exports use role/content inside `conversations`.
    if isinstance(conv, list) and conv and isinstance(conv[0], dict) and "role" in conv[0]:
        return _chat(conv, "role", "content", None, "conversations")
    turns, system = _chat(conv, "from", "value", SHAREGPT_ROLES, "conversations")
    if system is None and isinstance(record.get("system"), str) and record["system"].strip():
        system = record["system"]
    return turns, system


def _openai(record: dict, _column: str) -> tuple[list[str], str | None]:
    return _chat(record["messages"], "role", "content", None, "messages")


def _alpaca(record: dict, _column: str) -> tuple[list[str], str | None]:
    instruction = _text(record["instruction"], "'instruction'")
    extra = record.get("input") or ""
    if not isinstance(extra, str):
        raise MalformedRecord("'input' must be a string")
    return [instruction.strip() + ("\n\n" + extra.strip() if extra.strip() else "")], None


def _prompt(record: dict, column: str) -> tuple[list[str], str | None]:
    if column not in record:
        raise MalformedRecord(f"no field {column!r}")
    return [_text(record[column], repr(column))], None
