"""`eaglekit train` end to end on a tiny target: outputs, learning, refusals (exact resume after SIGKILL and DDP:
tests/integration/test_train_loop.py)."""

import json
import time
from pathlib import Path

import pytest
import torch

from eaglekit.cli import main
from eaglekit.draft.checkpoint import load_draft
from eaglekit.errors import EaglekitError
from eaglekit.features.capture import capture_features
from eaglekit.targets.load import load_target
from eaglekit.train.config import TrainConfig
from eaglekit.train.loop import train
from eaglekit.train.manifest import predicted_accept_length, validation_label
from tiny_conversations import greedy_samples, text_rows, write_generate_folder
from train_tiny import (
    config,
    train_args,
    train_data,  # noqa: F401 (fixture `data`)
)

torch.set_num_threads(1)


def test_offline_run_writes_a_loadable_draft_and_learns(data, tmp_path):
    """Held-out generalization is shown with SmolLM2 (docs/notes/training.md); 64 samples of a random
    tiny target only show that the draft learns what it is trained on, far beyond the unigram guess."""
    out = tmp_path / "run"
    manifest = train(config(data, out, max_steps=100, val_every=50, val_data=data["feat"], val_fraction=0.0))
    assert manifest["stage"] == "train" and manifest["complete"]
    assert manifest["aux_layer_ids"] == [1, 3, 4] and manifest["target"]["name"] == Path(data["target"]).name
    best = manifest["best"]
    # golden (seeded tiny target and data, 100 steps, one thread): the best validation's accuracy per
    # position, the accept length it simulates, and the walk's
    assert best["acc"] == pytest.approx([0.33253, 0.28926, 0.28686], rel=1e-4)
    assert best["cond_acc"] == pytest.approx([0.33253, 0.41832, 0.70213], rel=1e-4)
    assert best["sim_accept_length"] == pytest.approx(1.5693, rel=1e-4)
    assert best["walk_accept_length"] == pytest.approx(1.40716, rel=1e-4)
    assert [h["step"] for h in manifest["history"]] == [50, 100]
    baselines = manifest["counts"]["val_baselines"]
    # golden: the data is the target's greedy output (all but 1 of the 2496 positions)
    assert best["data_greedy_agreement"] == pytest.approx(0.9996, rel=1e-4)
    assert baselines["unigram_acc"] == pytest.approx(0.16546, rel=1e-4)  # golden: what the unigram guess gets
    assert best["acc"][0] > baselines["unigram_acc"] + 0.15, (best, baselines)
    draft = load_draft(out)
    assert (
        draft.config.aux_layer_ids == (1, 3, 4)
        and draft.config.draft_vocab_size == manifest["draft_vocab"]["draft_vocab_size"]
    )
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["event"] == "train"]
    assert train_lines and {"lr", "tokens_per_s", "acc", "sim_accept_length"} <= set(train_lines[0])
    assert train_lines[-1]["ce"][0] < train_lines[0]["ce"][0]


def test_online_run_from_conversations_with_a_given_vocab(data, tmp_path):
    from eaglekit.draft.vocab import DraftVocab

    ids = torch.tensor(sorted({2, *range(40, 140)}))
    DraftVocab(draft_ids=ids, vocab_size=384).save(tmp_path / "vocab")
    manifest = train(
        config(
            data,
            tmp_path / "run",
            features=None,
            data=data["conv"],
            max_steps=4,
            val_every=4,
            vocab=str(tmp_path / "vocab"),
        )
    )
    assert manifest["complete"] and manifest["inputs"]["data"]["conversations"] == 60
    assert manifest["best"]["step"] == 4
    assert manifest["draft_vocab"]["draft_vocab_size"] == len(ids)
    assert torch.equal(load_draft(tmp_path / "run").draft_to_target(torch.arange(len(ids))), ids)


def test_conversations_labelled_validation_are_never_trained_on(data, tmp_path):
    """`prompts build` holds out its own share and `generate` labels those conversations
    `split: validation`: training validates on them (besides its hash share) instead of training
    on them, online and through a feature store."""
    from eaglekit.features.conversations import read_conversations, tokenize_conversations
    from eaglekit.features.store import FeatureStore
    from eaglekit.train.setup import split_members

    target = load_target(data["target"])
    rows = [
        {**r, "split": "validation" if i % 6 == 0 else "train", "source": "chat" if i % 6 == 0 else "tasks"}
        for i, r in enumerate(text_rows(60))
    ]
    labelled = {r["id"] for r in rows if r["split"] == "validation"}
    conv = write_generate_folder(tmp_path / "conv", rows, target.fingerprint())
    manifest = train(
        config(data, tmp_path / "online", features=None, data=str(conv), max_steps=1, val_every=1, val_fraction=0.0)
    )
    assert manifest["counts"]["val_samples"] == len(labelled) == 10
    assert manifest["counts"]["train_samples"] == 50
    # The manifest says what the prediction is for: the held-out conversations, by their prompts' source.
    workload = manifest["counts"]["validation"]
    assert (workload["origin"], workload["by_source"]) == ("held_out", {"chat": 10})
    assert validation_label(manifest) == "held-out conversations: chat 10"
    other = train(
        config(
            data, tmp_path / "with-val", features=None, data=str(conv), val_data=data["conv"], max_steps=1, val_every=1
        )
    )  # a validation set of its own
    assert other["counts"]["train_samples"] == 50 and other["counts"]["val_samples"] == 60
    assert other["counts"]["validation"]["by_source"] == {"test": 60}
    assert validation_label(other) == "--val-data conversations: test 60"
    samples, _ = tokenize_conversations(target.tokenizer, read_conversations(conv)[0], max_length=256)
    capture_features(
        target,
        samples,
        tmp_path / "feat",
        aux_layer_ids=[1, 3, 4],
        topk=16,
        shard_tokens=800,
        batch_tokens=1024,
        progress=False,
    )
    store = FeatureStore(tmp_path / "feat")
    assert store.held_out == labelled
    train_idx, val_idx = split_members(store.ids, 0.15, store.held_out)
    assert labelled <= {store.ids[i] for i in val_idx} and not labelled & {store.ids[i] for i in train_idx}
    assert len(val_idx) > len(labelled)  # and the hash share besides


def test_cli_refuses_non_empty_out_and_resume_with_other_settings(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(data, out, "--max-steps", "2", "--val-every", "2", "--save-every", "2")) == 0
    assert main(train_args(data, out, "--max-steps", "2")) == 2
    assert "is not empty" in capsys.readouterr().err
    assert main(train_args(data, out, "--max-steps", "3", "--resume")) == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "max_steps" in err
    assert main(train_args(data, tmp_path / "fresh", "--resume")) == 2
    assert "holds no trainer state" in capsys.readouterr().err


def test_resume_on_features_captured_again_is_refused(data, tmp_path, capsys):
    """A run stopped, its features folder captured again with other aux layers, then --resume: it
    resumed (exit 0, complete) and the draft mixed two runs, its config's aux ids not its manifest's."""
    import shutil

    feat = tmp_path / "feat"
    shutil.copytree(data["feat"], feat)
    args = ["--max-steps", "2", "--val-every", "2", "--save-every", "2"]
    run = train_args(data, tmp_path / "run", *args)
    run[run.index("--features") + 1] = str(feat)
    assert main(run) == 0
    target = load_target(data["target"])
    samples = greedy_samples(target.model, target.tokenizer, 16, max_new_tokens=24)
    capture_features(
        target,
        samples,
        feat,
        aux_layer_ids=[2, 3, 4],
        topk=16,
        shard_tokens=1500,
        batch_tokens=1024,
        progress=False,
        overwrite=True,
    )
    capsys.readouterr()
    assert main(run + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume on other data than the run in" in err and "inputs" in err and "--overwrite" in err
    assert main(run + ["--overwrite"]) == 0  # the fix the hint names
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["aux_layer_ids"] == [2, 3, 4]


def test_features_of_another_target_are_refused_by_train(data, tmp_path, capsys):
    from tiny import save_tiny_target

    other = save_tiny_target(tmp_path / "other", "llama", num_layers=6)
    args = train_args(data, tmp_path / "run", "--max-steps", "2")
    args[args.index("--target") + 1] = str(other)
    assert main(args) == 2
    assert "was made for another target model config" in capsys.readouterr().err


def test_config_errors_are_clear():
    with pytest.raises(EaglekitError, match="exactly one of --features"):
        TrainConfig(target="t", out="o")
    with pytest.raises(EaglekitError, match="ttt_steps 0"):
        TrainConfig(target="t", out="o", data="d", ttt_steps=0)


def test_time_budget_stops_the_run_and_keeps_the_best(data, tmp_path):
    manifest = train(
        config(data, tmp_path / "run", max_steps=None, epochs=10000, time_budget_s=3.0, val_every=20, save_every=20)
    )
    assert manifest["complete"] and manifest["best"] is not None
    assert 10 <= manifest["steps"]["done"] == manifest["steps"]["total"] < 100000
    assert manifest["history"][-1]["step"] == manifest["steps"]["done"]


def test_a_slow_first_step_does_not_cut_the_time_budget_short(data, tmp_path, monkeypatch):
    """A --compile run spends its first step compiling (~200 s of a 540 s budget on an H200). The fit
    10 steps in once counted it as the pace and stopped that run at step 33 with most of its budget
    left (docs/results/2026-12-04-h200-compile-recipe). The run must spend its budget."""
    from eaglekit.train import loop

    real_step, calls = loop.Trainer.train_step, []

    def first_step_slow(self):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(2.0)  # the start-up (a compile) in step 1
        return real_step(self)

    monkeypatch.setattr(loop.Trainer, "train_step", first_step_slow)
    manifest = train(
        config(
            data, tmp_path / "run", max_steps=None, epochs=10000, time_budget_s=4.0, val_every=10000, save_every=10000
        )
    )
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    elapsed = max(e.get("elapsed_s", 0.0) for e in events)
    assert manifest["complete"] and elapsed > 0.75 * 4.0, (manifest["steps"], elapsed)


def test_init_from_with_no_steps_validates_the_draft_as_trained(data, tmp_path):
    """`--init-from D --max-steps 0` loads D's weights and vocab and only validates: on the same
    held-out split it measures what D's own run measured at its best step."""
    first = train(config(data, tmp_path / "first", max_steps=12))
    again = train(config(data, tmp_path / "again", max_steps=0, init_from=str(tmp_path / "first")))
    best, measured = first["best"], again["history"][0]
    assert measured["step"] == 0 and measured["positions"] == best["positions"]
    assert measured["acc"] == pytest.approx(best["acc"], abs=1e-6)
    assert measured["sim_accept_length"] == pytest.approx(best["sim_accept_length"], abs=1e-6)
    # A prediction for a served chain of k is the walk capped at k; none past the unrolled steps (3).
    assert predicted_accept_length(again, 2) == measured["walk_accept_length_by_k"][1] <= predicted_accept_length(again)
    assert (
        predicted_accept_length(again, 3) == measured["walk_accept_length"]
        and predicted_accept_length(again, 5) is None
    )
    # Features captured without a conversations folder in their manifest: the sources are unknown, and said so.
    assert again["counts"]["validation"]["by_source"] == {"unknown": again["counts"]["val_samples"]}
    with pytest.raises(EaglekitError, match="brings its own vocab"):
        config(data, tmp_path / "other", max_steps=0, init_from=str(tmp_path / "first"), vocab="v.safetensors")


# Golden values (torchtune style): 12 steps on the tiny seeded target, CPU fp32, one thread. A change
# that moves them changed what training computes; if that was meant, say why in the commit and pin
# the new values. Printed by the test on a mismatch.
GOLDEN = {
    "ce": [4.62891, 4.4626, 4.42216],
    "acc": [0.12821, 0.1352, 0.1352],
    "sim_accept_length": 1.27582,
    "walk_accept_length": 1.1224,
}


def test_golden_values_of_a_short_run(data, tmp_path):
    manifest = train(config(data, tmp_path / "run", max_steps=12, val_every=12))
    best = manifest["best"]
    got = {key: best[key] for key in GOLDEN}
    print("golden:", json.dumps(got))
    for key, want in GOLDEN.items():
        assert got[key] == pytest.approx(want, rel=1e-3, abs=1e-4), (key, got[key], want)


def test_the_time_budget_is_refit_while_the_pace_settles():
    """10, 50 and 200 steps in, then every 200 (a run's pace kept settling until step ~1000 on an H200)."""
    from eaglekit.train.loop import budget_refits

    assert budget_refits(0, 1000) == [10, 50, 200, 400, 600, 800]
    assert budget_refits(300, 700) == [310, 350, 500]  # a resumed run starts anew, within the cap
    assert budget_refits(0, 30) == [10]


def test_profile_steps_writes_where_a_step_goes(data, tmp_path, caplog):
    manifest = train(config(data, tmp_path / "run", max_steps=6, profile_steps="2:4"))
    text = (tmp_path / "run" / "profile.txt").read_text()
    assert manifest["complete"] and text.startswith("steps 3..4 (2) on cpu") and "ms a step" in text
    assert "aten::" in text and "by own host time" in text
    train(config(data, tmp_path / "first", max_steps=2, profile_steps="0:2"))
    assert (tmp_path / "first" / "profile.txt").read_text().startswith("steps 1..2 (2)")
    train(config(data, tmp_path / "late", max_steps=3, profile_steps="2:9"))
    assert not (tmp_path / "late" / "profile.txt").exists() and "no profile.txt written" in caplog.text
    with pytest.raises(EaglekitError, match="profile-steps"):
        config(data, tmp_path / "bad", profile_steps="5:5")


def test_training_runs_without_cudnn_attention_and_restores_it(data, tmp_path):
    """cuDNN's SDPA builds a host-side plan per new shape, and packed batches change shape every
    step (~90 ms of a 261 ms H200 step): training turns that backend off, and only for itself."""
    seen = []
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(torch.backends.cuda.cudnn_sdp_enabled())
    )
    try:
        assert torch.backends.cuda.cudnn_sdp_enabled()
        manifest = train(config(data, tmp_path / "run", max_steps=2, val_every=2))
    finally:
        hook.remove()
    assert manifest["complete"] and seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
