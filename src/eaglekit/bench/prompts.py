"""Benchmark prompts: a JSONL file ({"id", "turns"} as MT-bench, {"messages"}, {"prompt"}, ...), an
`eaglekit prompts` folder (its validation split), or a small built-in set when none is given."""

from __future__ import annotations

import json
from pathlib import Path

from eaglekit.data.folder import read_prompt_folder
from eaglekit.data.formats import to_prompt
from eaglekit.data.records import MalformedRecord, Prompt
from eaglekit.errors import EaglekitError

# Varied, short questions (writing, code, math, extraction) and one two-turn conversation, used
# when no prompts are given so that `eaglekit bench` always runs.
BUILTIN = [
    ["Write a short poem about the sea at night.", "Now rewrite it so that every line starts with the letter S."],
    ["Explain in three sentences why the sky is blue."],
    ["Write a Python function that returns the n-th Fibonacci number, with a docstring."],
    ["A train leaves at 3 pm and travels 180 km at 60 km/h. When does it arrive? Show your steps."],
    ["List five tips for a good night's sleep."],
    ["Summarize the plot of Romeo and Juliet in one paragraph."],
    ["Extract the names and ages: 'Ana is 31, her brother Tom is 27 and their father Luis is 63.'"],
    ["Give me a recipe for a simple tomato pasta."],
]


def builtin_prompts() -> list[Prompt]:
    return [Prompt(id=f"builtin-{i}", source="builtin", turns=list(t)) for i, t in enumerate(BUILTIN)]


def load_bench_prompts(path: str | Path | None, limit: int | None = None) -> list[Prompt]:
    """Prompts to benchmark, in file order (first `limit`).

    Args:
        path: a JSONL/JSON file of records in any format `eaglekit prompts` reads, a prompts folder
            (its validation split), or None for the built-in set.
        limit: keep the first `limit` prompts.
    """
    if path is None:
        prompts = builtin_prompts()
    else:
        path = Path(path)
        if path.is_dir():
            prompts = read_prompt_folder(path, splits=("validation",))[1]["validation"]
        elif path.is_file():
            prompts = read_records(path)
        else:
            raise EaglekitError(
                f"no such prompts file: {path}", hint="pass a JSONL file or an `eaglekit prompts` folder"
            )
    if not prompts:
        raise EaglekitError(f"{path} holds no prompts", hint="check the file")
    return prompts[:limit] if limit else prompts


def read_records(path: Path) -> list[Prompt]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise EaglekitError(f"{path} is not valid JSON ({err.msg})", hint="fix the file") from err
        records = records if isinstance(records, list) else [records]
    else:
        records = []
        for lineno, line in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise EaglekitError(
                        f"{path}:{lineno}: not JSON ({err.msg})", hint="one JSON object per line"
                    ) from err
    prompts = []
    for i, record in enumerate(records):
        try:
            prompts.append(to_prompt(record, fmt="auto", source=path.stem, index=i))
        except MalformedRecord as err:
            raise EaglekitError(
                f"{path}: record {i + 1}: {err}",
                hint='use {"id", "turns": [...]}, {"messages": [...]} or {"prompt": ...}',
            ) from err
    return prompts


def prompt_categories(path: str | Path | None) -> tuple[dict[str, str], str]:
    """id -> category of the bench's prompts: a record's `category` (MT-bench's writing, coding, ...),
    else its `source`, else the file's name; the built-in set is one category. The bench reads them
    for its figures per category, `eaglekit report` after the fact: a prompts file gone or edited
    since gives no categories and a note saying so."""
    if path is None:
        return {}, ""
    p = Path(path)
    if p.is_dir():
        return {pr.id: pr.source for pr in load_bench_prompts(p)}, ""
    if not p.is_file():
        return {}, f"the bench prompts {path} are gone: categories unknown"
    records = []
    try:
        if p.suffix == ".json":
            loaded = json.loads(p.read_text(encoding="utf-8"))
            records = loaded if isinstance(loaded, list) else [loaded]
        else:
            records = [json.loads(line) for line in p.read_text(encoding="utf-8").split("\n") if line.strip()]
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return {}, f"the bench prompts {path} no longer read as JSON ({err}): categories unknown"
    out = {}
    for i, r in enumerate(records):
        if isinstance(r, dict):
            rid = str(r.get("id", r.get("question_id", f"{p.stem}-{i}")))
            out[rid] = str(r.get("category") or r.get("source") or p.stem)
    return out, ""
