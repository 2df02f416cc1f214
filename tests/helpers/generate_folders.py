"""Prompts folders the generate tests build, and the conversations a generate folder holds, read back."""

from __future__ import annotations

import json
from pathlib import Path

from eaglekit.data.prompts import build_prompts
from eaglekit.data.readers import SourceSpec

QUESTIONS = [
    "What is the capital of France?",
    "Count from one to ten.",
    "Hello!",
    "Solve 12 * 7.",
    "Write a Python function that adds two numbers.",
    "The quick brown fox?",
    "How can I help you today?",
]


def make_prompts(tmp_path: Path, n: int, multi_every: int = 5) -> Path:
    rows = [
        {
            "id": f"p{i}",
            "turns": [f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"] + ([f"And then {i}?"] if i % multi_every == 0 else []),
        }
        for i in range(n)
    ]
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "prompts"
    build_prompts([SourceSpec.parse(str(src))], out, validation_fraction=0.2)
    return out


def read_rows(folder: Path) -> list[dict]:
    return [
        json.loads(line) for p in sorted(folder.glob("conversations-*.jsonl")) for line in p.read_text().splitlines()
    ]


def read_lines(folder: Path) -> list[bytes]:
    return [line for p in sorted(folder.glob("conversations-*.jsonl")) for line in p.read_bytes().splitlines()]


def generate_argv(prompts: Path, target: Path, out: Path, *extra: str) -> list[str]:
    return ["generate", "--prompts", str(prompts), "--target", str(target), "--out", str(out), *extra]


def by_id(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["id"])
