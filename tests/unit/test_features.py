"""Offline feature store: content, index while running, resume after a failure, refusals of bad input."""

import json

import pytest
import torch

from eaglekit.draft.vocab import build_draft_vocab, count_assistant_tokens
from eaglekit.errors import EaglekitError
from eaglekit.features import capture as capture_mod
from eaglekit.features.capture import capture_features, plan_shards
from eaglekit.features.conversations import read_conversations, tokenize_conversations
from eaglekit.features.store import FeatureStore
from eaglekit.targets.capture import capture_aux_states
from eaglekit.targets.load import load_target
from eaglekit.train.sources import OfflineSource, OnlineSource
from tiny_conversations import text_rows, write_generate_folder, write_jsonl

torch.set_num_threads(1)
AUX = [1, 3, 4]


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(str(tiny_target_dir))


@pytest.fixture(scope="module")
def samples(target):
    rows = text_rows(24)
    return tokenize_conversations(target.tokenizer, rows, max_length=256)[0]


def capture(target, samples, out, **kw):
    kw.setdefault("shard_tokens", 400)
    return capture_features(target, samples, out, aux_layer_ids=AUX, topk=8, batch_tokens=300, progress=False, **kw)


@pytest.fixture(scope="module")
def store_dir(target, samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("features")
    capture(target, samples, out)
    return out


def test_store_holds_what_the_target_computes(target, samples, store_dir):
    store = FeatureStore(store_dir, target_fingerprint=target.fingerprint(), hidden_size=64)
    manifest = store.manifest
    assert manifest["complete"] and manifest["counts"]["samples"] == len(samples) == len(store)
    assert manifest["counts"]["shards"] == len(plan_shards([s.length for s in samples], 400)) > 1
    assert manifest["counts"]["bytes_per_token"] > 0 and manifest["counts"]["baseline_bytes_per_token"] == 8 * 64
    assert 0 < manifest["counts"]["teacher_topk_mass"] <= 1.0 + 1e-3
    for i in (0, 7, len(samples) - 1):
        row = store.sample(i)
        s = samples[i]
        assert torch.equal(row["input_ids"], s.input_ids) and torch.equal(row["loss_mask"], s.loss_mask)
        ref = capture_aux_states(target.model, s.input_ids[None], AUX)
        assert row["aux"].dtype == torch.bfloat16 and row["aux"].shape == (s.length, 3 * 64)
        torch.testing.assert_close(row["aux"].float(), ref.aux_hidden[0].bfloat16().float(), atol=2e-2, rtol=2e-2)
        assert torch.equal(row["topk_ids"][:, 0].long(), ref.logits[0].argmax(-1))
        expected = ref.logits[0].log_softmax(-1).gather(-1, row["topk_ids"].long())
        torch.testing.assert_close(row["topk_logp"].float(), expected, atol=2e-2, rtol=1e-2)


def test_online_and_offline_batches_agree(target, samples, store_dir):
    store = FeatureStore(store_dir)
    counts = count_assistant_tokens(((s.input_ids, s.loss_mask) for s in samples), 384)
    vocab = build_draft_vocab(counts, 20, always_include=target.stop_token_ids, allow_smaller=True)
    off = OfflineSource(store, list(range(len(store))), vocab).batch([2, 5], torch.device("cpu"))
    on = OnlineSource(target.model, samples, AUX, vocab).batch([2, 5], torch.device("cpu"))
    assert torch.equal(off.input_ids, on.input_ids) and torch.equal(off.loss_mask, on.loss_mask)
    assert torch.equal(on.host_loss_mask, on.loss_mask) and torch.equal(off.host_loss_mask, off.loss_mask)
    real = off.loss_mask | (torch.arange(off.input_ids.shape[1]) < off.lengths[:, None])
    torch.testing.assert_close(off.aux.float()[real], on.aux[real], atol=3e-2, rtol=2e-2)
    assert torch.equal(off.teacher.argmax[real], on.teacher.argmax[real])


def test_index_is_readable_while_running_and_capture_resumes(target, samples, tmp_path, monkeypatch, store_dir):
    real = capture_mod.capture_shard
    calls = []

    def dies_after_two(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capture_mod, "capture_shard", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        capture(target, samples, tmp_path)
    with pytest.raises(EaglekitError, match=r"not finished \(2 shards so far\)") as err:
        FeatureStore(tmp_path)
    assert "--allow-partial-features" in err.value.hint
    partial = FeatureStore(tmp_path, allow_partial=True)
    assert 0 < len(partial) < len(samples) and not partial.complete

    calls.clear()
    monkeypatch.setattr(capture_mod, "capture_shard", lambda *a, **k: calls.append(1) or real(*a, **k))
    capture(target, samples, tmp_path)
    full = FeatureStore(store_dir)
    assert len(calls) == full.manifest["counts"]["shards"] - 2  # finished shards were skipped
    resumed = FeatureStore(tmp_path)
    assert resumed.complete and resumed.ids == full.ids
    for i in range(len(full)):
        a, b = resumed.sample(i), full.sample(i)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_into_a_folder_with_other_settings_is_refused(target, samples, store_dir, tmp_path):
    import shutil

    copy = tmp_path / "f"
    shutil.copytree(store_dir, copy)
    with pytest.raises(EaglekitError, match="other settings"):
        capture(target, samples, copy, shard_tokens=999)


def test_features_of_another_target_or_tokenizer_are_refused(target, store_dir):
    fp = target.fingerprint()
    with pytest.raises(EaglekitError, match="another target model config"):
        FeatureStore(store_dir, target_fingerprint={**fp, "config_hash": "0" * 16})
    with pytest.raises(EaglekitError, match="another tokenizer and chat template"):
        FeatureStore(store_dir, target_fingerprint={**fp, "tokenizer_hash": "0" * 16})
    with pytest.raises(EaglekitError, match=r"hold 64-wide states, the target's hidden size is 32"):
        FeatureStore(store_dir, hidden_size=32)


def test_a_features_manifest_missing_a_config_key_names_it(store_dir, tmp_path):
    """A hand-edited manifest without `teacher_topk` gave a bare KeyError from deep in training."""
    import shutil

    copy = tmp_path / "f"
    shutil.copytree(store_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["config"]["teacher_topk"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EaglekitError, match="manifest.json has no teacher_topk in its config") as err:
        FeatureStore(copy)
    assert "make the folder again" in err.value.hint


def test_truncated_shard_is_refused(store_dir, tmp_path):
    import shutil

    copy = tmp_path / "f"
    shutil.copytree(store_dir, copy)
    shard = sorted(copy.glob("shard-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(EaglekitError, match="truncated"):
        FeatureStore(copy)


def test_an_index_that_lost_shards_after_the_capture_is_refused(store_dir, tmp_path):
    """Entries removed from a finished store's index.json: half the samples were trained on, unsaid."""
    import shutil

    copy = tmp_path / "f"
    shutil.copytree(store_dir, copy)
    index = json.loads((copy / "index.json").read_text())
    counted = json.loads((copy / "manifest.json").read_text())["counts"]
    index["shards"] = index["shards"][:1]
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(
        EaglekitError,
        match=f"index 1 shards and .* samples, the finished capture counted "
        f"{counted['shards']} and {counted['samples']}",
    ) as err:
        FeatureStore(copy)
    assert "--overwrite" in err.value.hint


def test_shard_with_wrong_aux_width_is_refused(store_dir, tmp_path):
    import shutil

    copy = tmp_path / "f"
    shutil.copytree(store_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["config"]["aux_layer_ids"] = [1, 3]  # claims 2 layers, shards hold 3
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EaglekitError, match=r"aux states 192 wide, expected 2 aux layers x 64 = 128"):
        FeatureStore(copy)


def test_empty_data_is_refused(target, tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(EaglekitError, match="holds no conversations"):
        read_conversations(empty)
    no_answers = [{"id": "a", "messages": [{"role": "user", "content": "hello"}]}]
    rows, _ = read_conversations(write_jsonl(tmp_path / "q.jsonl", no_answers))
    with pytest.raises(EaglekitError, match="none of the 1 conversations has an answer to learn from"):
        tokenize_conversations(target.tokenizer, rows, max_length=64)


def test_a_conversation_cut_one_token_into_its_answer_is_dropped(target, tmp_path):
    rows, _ = read_conversations(
        write_jsonl(
            tmp_path / "c.jsonl",
            [
                {
                    "id": "a",
                    "messages": [
                        {"role": "user", "content": "hello there"},
                        {"role": "assistant", "content": "hi, how are you"},
                    ],
                }
            ],
        )
    )
    full, _ = tokenize_conversations(target.tokenizer, rows, max_length=256)
    first_answer = int(full[0].loss_mask.nonzero()[0])
    kept, _ = tokenize_conversations(target.tokenizer, rows, max_length=first_answer + 2)
    assert [s.id for s in kept] == ["a"]  # two answer tokens in a row: kept
    # One answer token: no position to learn from (a batch of only such rows would train on nothing).
    with pytest.raises(EaglekitError, match="none of the 1 conversations has an answer to learn from"):
        tokenize_conversations(target.tokenizer, rows, max_length=first_answer + 1)


def test_conversations_of_another_target_are_refused(target, tmp_path):
    fp = {**target.fingerprint(), "tokenizer_hash": "f" * 16}
    folder = write_generate_folder(tmp_path / "conv", text_rows(4), fp)
    with pytest.raises(EaglekitError, match="another tokenizer and chat template"):
        read_conversations(folder, target_fingerprint=target.fingerprint())
    rows, _ = read_conversations(
        write_generate_folder(tmp_path / "ok", text_rows(4), target.fingerprint()),
        target_fingerprint=target.fingerprint(),
    )
    assert len(rows) == 4


def test_unfinished_generate_folder_is_refused(tmp_path):
    write_jsonl(tmp_path / "conv" / "conversations-00000.jsonl", text_rows(2))
    with pytest.raises(EaglekitError, match="has no manifest.json"):
        read_conversations(tmp_path / "conv")


def test_features_and_vocab_cli(tiny_target_dir, tmp_path, capsys):
    from eaglekit.cli import main

    data = write_jsonl(tmp_path / "conv.jsonl", text_rows(10))
    args = [
        "features",
        "--target",
        str(tiny_target_dir),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "f"),
        "--aux-layer-ids",
        "1,3,4",
        "--teacher-topk",
        "4",
        "--shard-tokens",
        "300",
        "--device-map",
        "auto",
        "--no-progress",
    ]
    assert main(args) == 0
    assert "bytes/token" in capsys.readouterr().out
    assert main(args) == 0  # a finished store is reused as it is
    vocab_args = [
        "vocab",
        "--target",
        str(tiny_target_dir),
        "--features",
        str(tmp_path / "f"),
        "--draft-vocab-size",
        "300",
        "--out",
        str(tmp_path / "v"),
    ]
    assert main(vocab_args) == 2
    assert "distinct assistant tokens" in capsys.readouterr().err
    assert main(vocab_args + ["--allow-smaller-vocab"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["coverage"] == 1.0 and summary["draft_vocab_size"] < 300
    assert (tmp_path / "v" / "vocab.safetensors").is_file()
    assert json.loads((tmp_path / "v" / "manifest.json").read_text())["stage"] == "vocab"
