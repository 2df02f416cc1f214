"""Time the CPU data work of `eaglekit train`'s setup (online mode) phase by phase, without a GPU.

`--make N` first writes a synthetic conversations folder shaped like the generate stage's: N
conversations, about 1/3 multi-turn (2-3 turns), answers of ~470 tokens of prose, lists and
headings drawn Zipf-wise from the target's own word tokens. Then the phases of
`train.setup.prepare_online` / `prepare` run on it with the target's tokenizer: reading,
tokenizing (chat template + loss masks), the validation split, vocab counting, the token counts,
the unigram/bigram baselines and the batch plan. `--digest` hashes every sample and result, to
check that a change keeps them byte-identical.

    python scripts/bench_train_setup.py /tmp/conv42k --make 42200 --target /tmp/smollm2-hf
    python scripts/bench_train_setup.py /tmp/conv42k --target /tmp/smollm2-hf --digest /tmp/after.sha
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import time
from contextlib import contextmanager
from pathlib import Path

from make_prompts import TEMPLATES, TOPICS

FOLLOW_UPS = [
    "Can you tell me more about {t}?",
    "How does that relate to {t}?",
    "Give an example.",
    "Why is that?",
    "Summarize that in a list.",
]


class Writer:
    """Plausible answers: sentences of Zipf-drawn word tokens of the target's vocabulary."""

    def __init__(self, tokenizer, seed: int):
        self.rng = random.Random(seed)
        self.topics = [t.strip() for t in TOPICS.split(",") if t.strip()]
        by_id = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])  # BPE merge order ~ frequency
        self.words = [
            t[1:] for t, _ in by_id if t.startswith("\u0120") and t[1:].isalpha() and t[1:].islower() and len(t) > 3
        ]
        self.weights = list(itertools.accumulate(1.0 / (r + 20) for r in range(len(self.words))))

    def sentence(self) -> str:
        rng = self.rng
        words = rng.choices(self.words, cum_weights=self.weights, k=rng.randint(6, 22))
        if rng.random() < 0.15:
            words.insert(rng.randrange(len(words)), str(rng.randint(2, 2025)))
        if rng.random() < 0.2:
            words[rng.randrange(len(words))] += ","
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice(".....!?")

    def answer(self, tokens: int) -> str:
        parts, n = [], 0
        while n < tokens:
            kind = self.rng.random()
            if kind < 0.15:
                part = "\n".join(
                    f"{i + 1}. **{self.rng.choice(self.topics).title()}**: {self.sentence()}"
                    for i in range(self.rng.randint(2, 5))
                )
            elif kind < 0.22:
                part = f"### {self.rng.choice(self.topics).title()}"
            else:
                part = " ".join(self.sentence() for _ in range(self.rng.randint(2, 5)))
            parts.append(part)
            n += len(part) // 4 + 1
        return "\n\n".join(parts)

    def conversation(self, i: int) -> dict:
        rng = self.rng
        turns = 1 if rng.random() < 0.65 else rng.choice([2, 2, 2, 3])
        messages = (
            [{"role": "system", "content": "You are a concise, helpful assistant."}] if rng.random() < 0.1 else []
        )
        for turn in range(turns):
            prompt = rng.choice(TEMPLATES if turn == 0 else FOLLOW_UPS).format(t=rng.choice(self.topics))
            messages += [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": self.answer(max(20, int(rng.gauss(470, 170))))},
            ]
        return {"id": f"g{i:06d}", "source": "synthetic", "messages": messages}


def make_folder(out: Path, n: int, tokenizer, seed: int = 0, shard: int = 10000) -> None:
    from eaglekit.artifacts import CONVERSATION_SHARDS, write_manifest
    from eaglekit.data.folder import JsonlShards

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{CONVERSATION_SHARDS}-*.jsonl"):  # a rerun writes the folder anew (the shards append)
        old.unlink()
    writer, shards = Writer(tokenizer, seed), JsonlShards(out, CONVERSATION_SHARDS, shard)  # generate's own writer
    for first in range(0, n, shard):
        shards.append([writer.conversation(i) for i in range(first, min(n, first + shard))])
    shards.close()
    write_manifest(
        out,
        stage="generate",
        config={"synthetic": "scripts/bench_train_setup.py", "seed": seed},
        target=None,
        counts={"conversations": n},
    )


def digest(samples, results) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(s.id.encode())
        h.update(s.input_ids.numpy().tobytes())
        h.update(s.loss_mask.numpy().tobytes())
        h.update(repr((s.input_ids.dtype, s.loss_mask.dtype)).encode())
    h.update(repr(results).encode())
    return h.hexdigest()


def main() -> None:
    from eaglekit.pipeline.recipe import load_recipe
    from eaglekit.targets.source import DEFAULT_TARGET
    from eaglekit.train.config import TrainConfig

    recipe = load_recipe("smollm2-h200")["train"]  # the scale this measures: the real recipe's train section
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", type=Path, help="a conversations folder (written first with --make)")
    p.add_argument("--make", type=int, default=None, metavar="N", help="write N synthetic conversations first")
    p.add_argument("--target", default=DEFAULT_TARGET, help="whose tokenizer (an HF folder is quickest to load)")
    p.add_argument("--max-length", type=int, default=TrainConfig.max_length)
    p.add_argument("--val-fraction", type=float, default=TrainConfig.val_fraction)
    p.add_argument("--val-max-samples", type=int, default=recipe["val-max-samples"])
    p.add_argument("--draft-vocab-size", type=int, default=recipe["draft-vocab-size"])
    p.add_argument("--batch-tokens", type=int, default=recipe["batch-tokens"])
    p.add_argument("--digest", type=Path, default=None, help="write a sha256 of all samples and results here")
    args = p.parse_args()

    from eaglekit.draft.vocab import build_draft_vocab, count_assistant_tokens
    from eaglekit.features.conversations import read_conversations, tokenize_conversations
    from eaglekit.targets.load import generation_eos_ids, load_tokenizer, stop_token_ids
    from eaglekit.targets.source import resolve_target
    from eaglekit.train.baselines import baseline_accuracy
    from eaglekit.train.data import BatchPlan
    from eaglekit.train.setup import split_members

    times: dict[str, float] = {}

    @contextmanager
    def phase(name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        times[name] = time.perf_counter() - wall
        print(f"{name:>10}: {times[name]:7.2f} s wall {time.process_time() - cpu:7.2f} s cpu", flush=True)

    source = resolve_target(args.target)
    tok = load_tokenizer(source)
    stops = stop_token_ids(generation_eos_ids(source), tok)
    if args.make:
        make_folder(args.data, args.make, tok)
    with phase("read"):
        rows, _ = read_conversations(args.data)
    with phase("tokenize"):
        samples, counts = tokenize_conversations(tok, rows, max_length=args.max_length)
    with phase("split"):
        t_idx, v_idx = split_members([s.id for s in samples], args.val_fraction)
        train, val = [samples[i] for i in t_idx], [samples[i] for i in v_idx][: args.val_max_samples]
    with phase("vocab"):
        tally = count_assistant_tokens(((s.input_ids, s.loss_mask) for s in train), len(tok))
        vocab = build_draft_vocab(tally, args.draft_vocab_size, always_include=stops, allow_smaller=True)
    with phase("counts"):
        counts.update(
            train_tokens=sum(s.length for s in train),
            train_assistant_tokens=int(sum(int(s.loss_mask.sum()) for s in train)),
        )
    with phase("baselines"):
        baselines = baseline_accuracy(
            [(s.input_ids, s.loss_mask) for s in train], [(s.input_ids, s.loss_mask) for s in val]
        )
    with phase("batch_plan"):
        plan = BatchPlan(
            [s.length for s in train], batch_tokens=args.batch_tokens, max_batch_size=TrainConfig.max_batch_size, seed=0
        )
        plan.micro_batches(plan.total_steps(recipe["epochs"]) - 1)
    print(f"{'total':>10}: {sum(times.values()):7.2f} s wall")
    turns = sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    print(
        json.dumps(
            {
                "assistant_turns": turns,
                "longest": max(s.length for s in samples),
                **counts,
                "vocab": vocab.size,
                "coverage": vocab.coverage,
                "baselines": baselines,
            }
        )
    )
    if args.digest:
        results = (counts, baselines, t_idx, v_idx, vocab.draft_ids.tolist(), tally.tolist())
        args.digest.write_text(digest(samples, results) + "\n")
        print("digest", args.digest.read_text().strip())


if __name__ == "__main__":
    main()
