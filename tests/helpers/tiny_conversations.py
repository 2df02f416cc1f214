"""Small conversations the tests write themselves: prompts from a word list, answers by the target.

Answers are the target's own greedy continuation (as the generate stage would write them), so a
draft can learn them; nothing is read from ../shared/data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tiny import TRAIN_TEXT

WORDS = (
    "fox dog capital France Paris python function add numbers count one two three ten hello help "
    "assistant solve twelve seven quick brown lazy jumps write return today what how"
).split()


# Chat prompts with two-turn conversations and a system prompt (the vLLM backend tests).
CHAT_PROMPTS = [
    {"id": "a", "turns": ["What is the capital of France?", "And the capital of Germany?"]},
    {"id": "b", "turns": ["Write a haiku about the sea."]},
    {"id": "c", "turns": ["List three prime numbers."], "system": "Answer in one line."},
    {"id": "d", "turns": ["Explain recursion briefly.", "Give a Python example."]},
    {"id": "e", "turns": ["Translate 'good morning' to Spanish."]},
]


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + "?" for _ in range(n)]


@torch.no_grad()
def generate_conversations(
    model,
    tokenizer,
    n: int,
    *,
    max_new_tokens: int = 24,
    seed: int = 0,
    batch: int = 32,
    stop_ids: tuple[int, ...] = (),
) -> list[dict]:
    """n single-turn conversations whose answers the model wrote greedily."""
    from eaglekit.targets.chat import prompt_ids

    stops = set(stop_ids) | {tokenizer.eos_token_id}
    rows = []
    texts = prompts(n, seed)
    for start in range(0, n, batch):
        chunk = texts[start : start + batch]
        ids = [prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in chunk]
        width = max(len(x) for x in ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=sorted(stops),
        )
        for i, text in enumerate(chunk):
            new = out[i, width:].tolist()
            cut = next((k for k, t in enumerate(new) if t in stops), len(new))
            answer = tokenizer.decode(new[:cut], skip_special_tokens=True).strip()
            if answer:
                rows.append(
                    {
                        "id": f"c{start + i:05d}",
                        "source": "test",
                        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}],
                    }
                )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_generate_folder(folder: Path, rows: list[dict], fingerprint: dict, shards: int = 2) -> Path:
    """A folder shaped like the generate stage's output (shards + manifest with the target fingerprint)."""
    from eaglekit.artifacts import write_manifest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    per = (len(rows) + shards - 1) // shards
    for s in range(shards):
        write_jsonl(folder / f"conversations-{s:05d}.jsonl", rows[s * per : (s + 1) * per])
    write_manifest(folder, stage="generate", config={}, target=fingerprint, counts={"conversations": len(rows)})
    return folder


@torch.no_grad()
def greedy_samples(model, tokenizer, n: int, *, max_new_tokens: int = 32, seed: int = 0, batch: int = 32):
    """n samples in token space: a prompt, then the model's greedy continuation as the assistant's tokens.

    Unlike text conversations, nothing is decoded and re-encoded, so every assistant token is exactly
    the target's greedy choice (what regenerated data gives a real target).
    """
    from eaglekit.features.conversations import Sample
    from eaglekit.targets.chat import prompt_ids

    samples = []
    texts = prompts(n, seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for start in range(0, n, batch):
        chunk = texts[start : start + batch]
        ids = [prompt_ids(tokenizer, [{"role": "user", "content": t}]) for t in chunk]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
        for i, prompt in enumerate(ids):
            new = out[i, width:].tolist()
            samples.append(
                Sample(
                    f"g{start + i:05d}",
                    torch.tensor(prompt + new),
                    torch.tensor([False] * len(prompt) + [True] * len(new)),
                )
            )
    return samples


def text_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        q, a = TRAIN_TEXT[i % len(TRAIN_TEXT)], TRAIN_TEXT[(3 * i + 1) % len(TRAIN_TEXT)]
        rows.append(
            {
                "id": f"t{i:04d}",
                "source": "test",
                "messages": [
                    {"role": "user", "content": f"{q} ({i})"},
                    {"role": "assistant", "content": " ".join([a] * (1 + i % 3))},
                ],
            }
        )
    return rows


@pytest.fixture(name="prompts_file")
def bench_prompts_file(tmp_path):
    """A bench prompts file of each shape: turns (two of them), messages with a system prompt, a bare prompt."""
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"id": "a", "turns": ["Hello! How can I help you today?", "Count from one to ten."]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 * 7?"}]},
        {"prompt": "Write a Python function that adds two numbers."},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
