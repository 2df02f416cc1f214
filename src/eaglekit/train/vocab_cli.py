"""`eaglekit vocab`: build the draft vocabulary (d2t/t2d) from the assistant tokens of the data.

A step of training's data work (it reads conversations or a feature store), so it lives in `train/`;
`draft/` holds only the draft itself and imports no stage above it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglekit.artifacts import MANIFEST, write_manifest, writer_lock
from eaglekit.options import add_options
from eaglekit.train.config import TrainConfig

VOCAB_OPTIONS = ("target", "draft_vocab_size", "allow_smaller_vocab", "max_length")


def register(sub) -> None:
    p = sub.add_parser(
        "vocab",
        help="build the draft vocabulary from assistant-token frequencies",
        description="Count the tokens the assistant writes, keep the most frequent "
        "--draft-vocab-size (end of turn and EOS always), write vocab.safetensors "
        "(d2t offsets, t2d mask) and report coverage.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="conversations folder or .jsonl")
    src.add_argument("--features", help="feature folder from `eaglekit features`")
    p.add_argument("--out", required=True, help="output folder")
    # The vocabulary training builds itself: the same options, declared once in TrainConfig.
    add_options(
        p,
        TrainConfig,
        groups={"inputs": None, "draft": None, "training": None},
        only=("inputs", "draft", "training"),
        names=VOCAB_OPTIONS,
    )
    p.set_defaults(func=run_vocab)


def run_vocab(args: argparse.Namespace) -> int:
    from eaglekit.draft.vocab import build_draft_vocab, count_assistant_tokens
    from eaglekit.train.target_parts import load_target_parts

    parts = load_target_parts(args.target)
    vocab_size = parts.text_config.vocab_size
    if args.data:
        from eaglekit.features.conversations import read_conversations, tokenize_conversations

        rows, data_fp = read_conversations(args.data, target_fingerprint=parts.fingerprint)
        samples, _ = tokenize_conversations(parts.tokenizer, rows, max_length=args.max_length)
        pairs = ((s.input_ids, s.loss_mask) for s in samples)
        inputs = {"data": data_fp}
    else:
        from eaglekit.features.store import FeatureStore

        store = FeatureStore(
            args.features, target_fingerprint=parts.fingerprint, hidden_size=parts.text_config.hidden_size
        )
        pairs = store.token_masks()
        inputs = {"features": str(store.folder.resolve())}
    counts = count_assistant_tokens(pairs, vocab_size)
    vocab = build_draft_vocab(
        counts, args.draft_vocab_size, always_include=parts.stop_token_ids, allow_smaller=args.allow_smaller_vocab
    )
    with writer_lock(args.out, stage="vocab"):
        (Path(args.out) / MANIFEST).unlink(missing_ok=True)  # the manifest is written last, over the new vocab
        vocab.save(args.out)
        write_manifest(
            args.out,
            stage="vocab",
            config={"draft_vocab_size": args.draft_vocab_size, "allow_smaller_vocab": args.allow_smaller_vocab},
            target=parts.fingerprint,
            inputs=inputs,
            counts=vocab.summary(),
        )
    print(json.dumps(vocab.summary()))
    return 0
