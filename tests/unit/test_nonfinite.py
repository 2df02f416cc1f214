"""No NaN passes as a draft: non-finite values are refused where they enter (issue 41).

The target's states at capture, a feature store as training reads it, every training step, and
every draft a command loads (export, bench, speculate, doctor). Each test fails on the code before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglekit.artifacts import write_manifest
from eaglekit.cli import main
from eaglekit.draft.checkpoint import load_draft, save_draft
from eaglekit.errors import EaglekitError, RunFailed
from eaglekit.features.capture import capture_features
from eaglekit.features.conversations import tokenize_conversations
from eaglekit.features.store import FORMAT, FeatureStore
from eaglekit.targets import load_target
from eaglekit.train.config import TrainConfig
from eaglekit.train.loop import Trainer
from engine_tiny import random_draft
from tiny_conversations import text_rows

torch.set_num_threads(1)
AUX = [1, 3, 4]


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(str(tiny_target_dir))


@pytest.fixture(scope="module")
def samples(target):
    return tokenize_conversations(target.tokenizer, text_rows(16), max_length=128)[0]


@pytest.fixture(scope="module")
def store(target, samples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nonfinite") / "feat"
    capture_features(
        target, samples, out, aux_layer_ids=AUX, topk=8, shard_tokens=300, batch_tokens=300, progress=False
    )
    return out


def poisoned_copy(store: Path, dest: Path, values: int = 10) -> Path:
    """The store with `values` aux values of its first shard set to NaN (as a bad capture or a bad
    disk leaves them)."""
    import shutil

    shutil.copytree(store, dest)
    shard = dest / "shard-00000.safetensors"
    tensors = load_file(str(shard))
    tensors["aux"].view(-1)[:values] = float("nan")
    save_file(tensors, str(shard), metadata={"format": FORMAT})
    return dest


# ---- features -------------------------------------------------------------------------------------


def test_capture_refuses_a_target_that_computes_nan(tiny_target_dir, samples, tmp_path):
    target = load_target(str(tiny_target_dir))
    with torch.no_grad():
        target.model.model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")  # reaches aux layer 3
    with pytest.raises(
        EaglekitError, match="the target computed .* NaN/Inf aux values .*for conversation 't0000'"
    ) as err:
        capture_features(target, samples, tmp_path / "feat", aux_layer_ids=AUX, topk=8, progress=False)
    assert "--dtype" in err.value.hint
    assert not list((tmp_path / "feat").glob("shard-*.safetensors"))


def test_a_store_holding_nan_is_refused_as_it_is_read(store, tmp_path):
    bad = poisoned_copy(store, tmp_path / "feat")
    reader = FeatureStore(bad)
    with pytest.raises(EaglekitError, match=r"sample '.*' \(shard-00000.safetensors\) holds 10 NaN/Inf aux values"):
        reader.sample(0)
    assert reader.sample(len(reader) - 1)["aux"].isfinite().all()  # the other shards read as before


def test_train_on_features_holding_nan_stops_and_marks_nothing_complete(tiny_target_dir, store, tmp_path, capsys):
    """Before: train finished, manifest `complete: true`, every weight NaN."""
    bad = poisoned_copy(store, tmp_path / "feat")
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--target",
            str(tiny_target_dir),
            "--features",
            str(bad),
            "--out",
            str(out),
            "--draft-vocab-size",
            "64",
            "--allow-smaller-vocab",
            "--ttt-steps",
            "2",
            "--batch-tokens",
            "300",
            "--max-steps",
            "12",
            "--val-fraction",
            "0",
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "holds 10 NaN/Inf aux values" in err and "Traceback" not in err
    manifest = out / "manifest.json"
    assert not manifest.exists() or json.loads(manifest.read_text())["complete"] is False
    assert not (out / "model.safetensors").exists()


# ---- every training step --------------------------------------------------------------------------


def test_training_stops_at_the_first_non_finite_step(tiny_target_dir, store, tmp_path):
    cfg = TrainConfig(
        target=str(tiny_target_dir),
        features=str(store),
        out=str(tmp_path / "run"),
        draft_vocab_size=64,
        allow_smaller_vocab=True,
        ttt_steps=2,
        batch_tokens=300,
        max_steps=6,
        val_fraction=0.0,
        save_every=3,
        log_every=3,
        progress=False,
        device="cpu",
    )
    trainer = Trainer(cfg)
    with torch.no_grad():
        trainer.draft.fc.weight[0, 0] = float("inf")  # a diverged update: everything after it is NaN
    with pytest.raises(RunFailed, match=r"training stopped at step 1 of 6: the loss is nan") as err:
        trainer.fit()
    assert err.value.exit_code == 1 and "Nothing is marked complete" in err.value.message
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["stopped"].startswith("step 1: the loss is nan")
    assert not (tmp_path / "run" / "model.safetensors").exists()  # no NaN weights written
    assert not (tmp_path / "run" / "trainer_state").exists() or not any((tmp_path / "run" / "trainer_state").iterdir())


# ---- every draft a command loads ------------------------------------------------------------------


@pytest.fixture(scope="module")
def drafts(target, tmp_path_factory) -> dict[str, Path]:
    """Native drafts for the tiny target with a finished train manifest: one NaN, one Inf weight tensor."""
    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for kind, value in (("nan", float("nan")), ("inf", float("inf"))):
        draft = random_draft(target.model, aux=AUX)
        with torch.no_grad():
            draft.midlayer.mlp.down_proj.weight[3, :5] = value
        folder = save_draft(draft, root / kind)
        write_manifest(folder, stage="train", config={}, target=target.fingerprint(), extra={"complete": True})
        out[kind] = folder
    return out


SHOWN = {"nan": "NaN", "inf": "Inf"}


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_load_draft_refuses_non_finite_weights(drafts, kind):
    with pytest.raises(EaglekitError, match=rf"tensor midlayer.mlp.down_proj.weight holds 5 {SHOWN[kind]} of"):
        load_draft(drafts[kind])


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("command", ["export", "bench", "speculate", "doctor"])
def test_every_command_refuses_a_draft_with_non_finite_weights(
    drafts, tiny_target_dir, tmp_path, capsys, command, kind
):
    """Before: export of an Inf draft "reload check passed", of a NaN draft "a bug in eaglekit";
    bench exit 0 with tau 1.00 "1.13x faster"; speculate exit 0. (The doctor's `weights` check
    failed them already; kept here so every reader of a draft stays covered.)"""
    draft, target = str(drafts[kind]), str(tiny_target_dir)
    if command in ("bench", "speculate"):  # refused before the target loads: a missing one is never reached
        target = str(tmp_path / "no-such-target")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "turns": ["hi"]}) + "\n")
    argv = {
        "export": ["export", draft, "--format", "vllm", "--out", str(tmp_path / "e")],
        "bench": [
            "bench",
            "--draft",
            draft,
            "--target",
            target,
            "--prompts",
            str(prompts),
            "--limit",
            "1",
            "--max-new-tokens",
            "4",
            "--mode",
            "chain",
            "--k",
            "2",
            "--no-hf",
            "--out",
            str(tmp_path / "b"),
        ],
        "speculate": [
            "speculate",
            "hi",
            "--draft",
            draft,
            "--target",
            target,
            "--mode",
            "chain",
            "--k",
            "2",
            "--max-new-tokens",
            "4",
        ],
        "doctor": ["doctor", draft, "--target", target, "--json"],
    }[command]
    code = main(argv)
    out, err = capsys.readouterr()
    if command == "doctor":  # the doctor reports it as its failed `weights` check
        weights = next(c for c in json.loads(out)["checks"] if c["id"] == "weights")
        assert code == 1 and weights["status"] == "fail"
        assert weights["message"] == "non-finite values in midlayer.mlp.down_proj.weight"
        return
    assert code == 2
    assert f"tensor midlayer.mlp.down_proj.weight holds 5 {SHOWN[kind]} of" in err and "please report" not in err
    assert not (tmp_path / "e").exists()


def test_an_export_whose_dtype_overflows_a_weight_is_refused(target, tmp_path, capsys):
    """A finite float32 weight past float16's range (65,504) becomes Inf in a float16 export: refused,
    no folder written (the reload check compared the Inf copy with itself and passed)."""
    draft = random_draft(target.model, aux=AUX)
    with torch.no_grad():
        draft.midlayer.mlp.down_proj.weight[0, :2] = 1e6
    folder = save_draft(draft, tmp_path / "big")
    write_manifest(folder, stage="train", config={}, target=target.fingerprint(), extra={"complete": True})
    code = main(["export", str(folder), "--format", "vllm", "--dtype", "float16", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and "midlayer.mlp.down_proj.weight holds 2 Inf" in err and "overflow float16" in err
    assert not (tmp_path / "e").exists()
    assert main(["export", str(folder), "--format", "vllm", "--dtype", "float32", "--out", str(tmp_path / "f")]) == 0
