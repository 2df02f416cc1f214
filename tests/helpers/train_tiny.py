"""A tiny peaked target with its conversations and greedy features (`data`, a module fixture), and a
short training run's config and command line, for tests/*/test_train_loop.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from eaglekit.features.capture import capture_features
from eaglekit.targets.load import load_target
from eaglekit.train.config import TrainConfig
from tiny_conversations import greedy_samples, text_rows, write_generate_folder

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


def peaked_tiny_target(folder: Path) -> Path:
    """A tiny target with a sharp next-token distribution, as a trained LM has (random ones are flat)."""
    from tiny import save_tiny_target

    save_tiny_target(folder, "llama")
    target = load_target(str(folder))
    with torch.no_grad():
        target.model.get_output_embeddings().weight.mul_(4.0)
    target.model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", name="data")
def train_data(tmp_path_factory):
    """A generate-style conversations folder and a feature store of greedy samples, for a tiny target."""
    root = tmp_path_factory.mktemp("train")
    tiny_target_dir = peaked_tiny_target(root / "target")
    target = load_target(str(tiny_target_dir))
    rows = text_rows(60)
    conv = write_generate_folder(root / "conv", rows, target.fingerprint())
    # Offline features from the target's own greedy continuations (token space: exactly its choices).
    samples = greedy_samples(target.model, target.tokenizer, 64, max_new_tokens=40)
    capture_features(
        target,
        samples,
        root / "feat",
        aux_layer_ids=[1, 3, 4],
        topk=16,
        shard_tokens=1500,
        batch_tokens=1024,
        progress=False,
    )
    return {"target": str(tiny_target_dir), "conv": str(conv), "feat": str(root / "feat"), "root": root}


def config(fixture, out, **kw) -> TrainConfig:
    base = dict(
        target=fixture["target"],
        features=fixture["feat"],
        out=str(out),
        draft_vocab_size=64,
        allow_smaller_vocab=True,
        ttt_steps=3,
        batch_tokens=600,
        max_batch_size=8,
        max_steps=12,
        val_fraction=0.15,
        val_every=6,
        save_every=4,
        log_every=2,
        lr=3e-3,
        warmup_steps=2,
        progress=False,
        device="cpu",
    )
    base.update(kw)
    return TrainConfig(**base)


def train_args(fixture, out, *extra) -> list[str]:
    return [
        "train",
        "--target",
        fixture["target"],
        "--features",
        fixture["feat"],
        "--out",
        str(out),
        "--draft-vocab-size",
        "64",
        "--allow-smaller-vocab",
        "--ttt-steps",
        "3",
        "--batch-tokens",
        "600",
        "--max-batch-size",
        "8",
        "--val-fraction",
        "0.15",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--device",
        "cpu",
        "--no-progress",
        *extra,
    ]
