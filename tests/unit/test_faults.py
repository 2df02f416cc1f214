"""The faults and bad inputs eaglekit survives, one test each (the list with outcomes: docs/reliability.md).

Every test plants one fault as a user meets it (a second run into a folder in use, a killed
training run's draft, a fine-tune passed as the target, a broken emoji escape, an empty file ...)
and checks the clear refusal or the exact recovery. Each fails on the code before issue 14.
A running writer is stood in for by holding the folder's writer lock, as the stage itself does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from eaglekit.artifacts import write_manifest, writer_lock
from eaglekit.cli import main
from eaglekit.draft.checkpoint import save_draft
from eaglekit.errors import EaglekitError
from eaglekit.targets import load_target
from engine_tiny import one_thread, random_draft  # noqa: F401 (fixture)
from tiny import save_tiny_target, without_name

PROMPTS = ["What is the capital of France?", "Count from one to ten.", "Write a haiku about rain."]


def prompt_file(folder: Path, lines: list[str] | None = None) -> Path:
    path = folder / "prompts.jsonl"
    rows = lines if lines is not None else [json.dumps({"id": f"p{i}", "turns": [t]}) for i, t in enumerate(PROMPTS)]
    path.write_text("".join(line + "\n" for line in rows), encoding="utf-8")
    return path


def generate(prompts: Path, target: Path, out: Path, *extra: str) -> int:
    return main(
        [
            "generate",
            "--prompts",
            str(prompts),
            "--target",
            str(target),
            "--out",
            str(out),
            "--backend",
            "hf",
            "--max-new-tokens",
            "4",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """A tiny target and its "fine-tune": the same config and tokenizer, other weights."""
    root = tmp_path_factory.mktemp("targets")
    return {"base": save_tiny_target(root / "base", seed=0), "tuned": save_tiny_target(root / "tuned", seed=1)}


def draft_folder(target_dir: Path, out: Path, **manifest_extra) -> Path:
    """A native draft for `target_dir` with a train manifest (finished unless told otherwise)."""
    target = load_target(target_dir)
    folder = save_draft(random_draft(target.model, aux=[1, 3, 4]), out)
    write_manifest(folder, stage="train", config={}, target=target.fingerprint(), extra=manifest_extra)
    return folder


KILLED = {"complete": False, "steps": {"done": 40, "total": 300}}  # what a killed `eaglekit train` leaves


# ---- two runs into one folder --------------------------------------------------------------------


def test_a_second_train_into_a_folder_in_use_is_refused(targets, tmp_path, capsys):
    out = tmp_path / "run"
    with writer_lock(out, stage="train"):  # the first run, still loading its data
        code = main(
            [
                "train",
                "--target",
                str(targets["base"]),
                "--features",
                str(tmp_path / "feat"),
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
    assert code == 2 and "another `eaglekit train` is writing to" in capsys.readouterr().err
    assert not any(out.iterdir())


def test_a_finished_train_folder_needs_resume_or_overwrite(targets, tmp_path, capsys):
    from eaglekit.features.capture import capture_features
    from tiny_conversations import greedy_samples

    target = load_target(targets["base"])
    feat = tmp_path / "feat"
    capture_features(
        target,
        greedy_samples(target.model, target.tokenizer, 8, max_new_tokens=12),
        feat,
        aux_layer_ids=[1, 3, 4],
        topk=8,
        progress=False,
    )
    argv = [
        "train",
        "--target",
        str(targets["base"]),
        "--features",
        str(feat),
        "--out",
        str(tmp_path / "run"),
        "--draft-vocab-size",
        "64",
        "--allow-smaller-vocab",
        "--ttt-steps",
        "2",
        "--max-steps",
        "2",
        "--batch-tokens",
        "400",
        "--val-fraction",
        "0.25",
        "--device",
        "cpu",
        "--no-progress",
    ]
    assert main(argv) == 0
    first = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert main(argv) == 2 and "--overwrite to delete it and start over" in capsys.readouterr().err
    assert main(argv + ["--overwrite", "--seed", "1"]) == 0
    again = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert again["complete"] and again["config"]["seed"] == 1 != first["config"]["seed"]
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    events = [(r["event"], r["step"]) for r in log]
    assert len(events) == len(set(events))  # one run's log, not two runs' lines mixed


def test_generate_overwrite_takes_the_lock_before_deleting(targets, tmp_path, capsys):
    prompts = prompt_file(tmp_path)
    out = tmp_path / "gen"
    assert generate(prompts, targets["base"], out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with writer_lock(out, stage="generate"):  # a run still writing there
        assert generate(prompts, targets["base"], out, "--overwrite", "--seed", "3") == 2
    assert "another `eaglekit generate` is writing to" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing deleted
    assert generate(prompts, targets["base"], out, "--overwrite", "--seed", "3") == 0  # once it is free


def test_writers_of_every_kind_refuse_a_folder_in_use(targets, tmp_path, capsys):
    draft = draft_folder(targets["base"], tmp_path / "draft")
    prompts = prompt_file(tmp_path)
    cases = {
        "export": ["export", str(draft), "--format", "sglang", "--out", "{out}"],
        "import": ["import", str(draft), "--out", "{out}"],
        "prompts": ["prompts", "build", "--source", str(prompts), "--out", "{out}"],
        "target prepare": ["target", "prepare", "--target", str(targets["base"]), "--out", "{out}"],
    }
    for stage, argv in cases.items():
        out = tmp_path / stage.replace(" ", "-")
        with writer_lock(out, stage=stage):
            assert main([a.format(out=out) for a in argv]) == 2, stage
        assert "is writing to" in capsys.readouterr().err, stage
        assert not any(out.iterdir()), f"{stage} wrote into a folder in use"


def test_features_and_run_refuse_a_folder_in_use(targets, tmp_path, capsys):
    from eaglekit.features.capture import capture_features

    with writer_lock(tmp_path / "feat", stage="features"):
        with pytest.raises(EaglekitError, match="another `eaglekit features` is writing"):
            capture_features(load_target(targets["base"]), [], tmp_path / "feat", aux_layer_ids=[1, 3, 4])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\ntarget: {targets['base']}\n")
    with writer_lock(tmp_path / "runs", stage="run"):
        assert main(["run", "--recipe", str(recipe), "--out", str(tmp_path / "runs"), "--stop-before", "prompts"]) == 2
    assert "another `eaglekit run` is writing to" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "target").exists()


def test_a_folder_without_manifest_says_it_is_unfinished_and_what_to_run(tmp_path, targets):
    from eaglekit.features.conversations import read_conversations

    out = tmp_path / "gen"
    out.mkdir()
    (out / "run.json").write_text("{}")  # a generate that was killed: its run file first,
    (out / "conversations-00000.jsonl").write_text("")  # then a shard
    with pytest.raises(EaglekitError, match="did not finish writing it") as err:
        read_conversations(out)
    assert "rerun `eaglekit generate` with the same --out" in str(err.value)
    with writer_lock(out, stage="generate"), pytest.raises(EaglekitError, match="still being written"):
        read_conversations(out)


# ---- an unfinished draft -------------------------------------------------------------------------


def test_an_unfinished_draft_is_refused_by_export_doctor_bench_and_speculate(targets, tmp_path, capsys):
    draft = draft_folder(targets["base"], tmp_path / "draft", **KILLED)
    target = str(targets["base"])
    missing_target = str(tmp_path / "no-target")  # refused before the target is even looked at
    for argv in (
        ["export", str(draft), "--format", "vllm", "--out", str(tmp_path / "e")],
        ["doctor", str(draft), "--target", target],
        ["bench", "--draft", str(draft), "--target", missing_target, "--out", str(tmp_path / "b")],
        ["speculate", "hi", "--draft", str(draft), "--target", missing_target],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "is unfinished: its `eaglekit train` run stopped at step 40 of 300" in err, argv
        assert "--allow-unfinished" in err and "--resume" in err, argv
    assert not (tmp_path / "e").exists() and not (tmp_path / "b").exists()


def test_a_train_run_killed_before_its_first_manifest_is_unfinished(targets, tmp_path, capsys):
    """Weights and a trainer state but no manifest (a kill between the first draft save and its
    manifest) exported as a finished draft; a run with no draft yet said only "no weights"."""
    draft = draft_folder(targets["base"], tmp_path / "draft")
    (draft / "manifest.json").unlink()
    (draft / "trainer_state").mkdir()
    assert main(["export", str(draft), "--format", "vllm", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "holds a trainer state but wrote no manifest yet" in err and "--resume" in err
    assert not (tmp_path / "e").exists()
    for weights in draft.glob("*.safetensors"):
        weights.unlink()
    assert main(["export", str(draft), "--format", "vllm", "--out", str(tmp_path / "e")]) == 2
    assert "is an `eaglekit train` run that has saved no draft yet" in capsys.readouterr().err


def test_export_of_a_train_killed_before_its_first_draft_says_unfinished(targets, tmp_path, capsys):
    """Issue 41: a killed train (manifest `complete: false`, no config.json yet) exported with
    "draft config not found ... check the path", which sent the user to a path that was right."""
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "trainer_state").mkdir()
    write_manifest(draft, stage="train", config={}, target=None, extra=KILLED)
    assert main(["export", str(draft), "--format", "vllm", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "is unfinished: its `eaglekit train` run stopped at step 40 of 300" in err and "--resume" in err
    assert "config not found" not in err and not (tmp_path / "e").exists()


def test_train_refuses_to_init_from_an_unfinished_draft(targets, tmp_path):
    from eaglekit.train.config import TrainConfig
    from eaglekit.train.setup import initial_draft

    draft = draft_folder(targets["base"], tmp_path / "draft", **KILLED)
    cfg = dict(
        target=str(targets["base"]),
        data=str(tmp_path / "conversations"),
        out=str(tmp_path / "again"),
        init_from=str(draft),
    )
    with pytest.raises(EaglekitError, match="is unfinished: its `eaglekit train` run stopped at step 40") as err:
        initial_draft(TrainConfig(**cfg))
    assert "--resume" in err.value.hint and "--allow-unfinished" in err.value.hint
    assert initial_draft(TrainConfig(**cfg, allow_unfinished=True)) is not None


def test_allow_unfinished_marks_every_output(targets, tmp_path, capsys):
    from eaglekit.doctor.run import run_doctor

    draft = draft_folder(targets["base"], tmp_path / "draft", **KILLED)
    target = str(targets["base"])
    assert main(["export", str(draft), "--format", "sglang", "--out", str(tmp_path / "e"), "--allow-unfinished"]) == 0
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert "step 40 of 300" in manifest["unfinished_draft"] and "step 40" in config["eaglekit"]["unfinished"]
    # The export carries the mark: it is as unfinished as its source, for every reader.
    with pytest.raises(EaglekitError, match="is unfinished"):
        run_doctor(tmp_path / "e", target)
    report = run_doctor(tmp_path / "e", target, allow_unfinished=True)
    assert report.checks[0].id == "finished" and report.checks[0].status == "warn"
    assert report.to_dict()["unfinished_draft"]
    prompts = prompt_file(tmp_path)
    assert (
        main(
            [
                "bench",
                "--draft",
                str(draft),
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
                "--allow-unfinished",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["unfinished_draft"]
    assert (tmp_path / "b" / "report.md").read_text().startswith("**Unfinished draft**")
    assert (
        main(
            [
                "speculate",
                "hi",
                "--draft",
                str(draft),
                "--target",
                target,
                "--mode",
                "chain",
                "--k",
                "2",
                "--max-new-tokens",
                "4",
                "--allow-unfinished",
            ]
        )
        == 0
    )
    assert "[unfinished draft: its `eaglekit train` run stopped at step 40 of 300" in capsys.readouterr().out


# ---- the target fingerprint covers the weights ---------------------------------------------------


def test_data_made_for_a_fine_tune_with_the_same_config_is_refused(targets, tmp_path):
    from eaglekit.features.conversations import read_conversations
    from tiny_conversations import write_generate_folder

    base, tuned = load_target(targets["base"]).fingerprint(), load_target(targets["tuned"]).fingerprint()
    assert base["config_hash"] == tuned["config_hash"] and base["tokenizer_hash"] == tuned["tokenizer_hash"]
    assert base["weights_hash"] != tuned["weights_hash"]
    rows = [
        {
            "id": "a",
            "source": "s",
            "split": "train",
            "meta": {},
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        }
    ]
    folder = write_generate_folder(tmp_path / "conv", rows, base)
    with pytest.raises(EaglekitError, match="was made for another target weights"):
        read_conversations(folder, target_fingerprint=tuned)


def test_the_doctor_fails_target_for_other_weights_and_never_passes_an_unrecorded_one(targets, tmp_path):
    from eaglekit.doctor.run import run_doctor

    draft = draft_folder(targets["base"], tmp_path / "draft")
    check = {c.id: c for c in run_doctor(draft, str(targets["tuned"])).checks}["target"]
    assert check.status == "fail" and "other weights" in check.message
    check = {c.id: c for c in run_doctor(draft, str(targets["base"])).checks}["target"]
    assert check.status == "pass"
    (draft / "manifest.json").unlink()  # a third-party draft: no target recorded
    check = {c.id: c for c in run_doctor(draft, str(targets["base"])).checks}["target"]
    assert check.status == "warn" and "no target recorded" in check.message


def test_a_prepared_folder_is_its_source_until_its_weights_change(targets, tmp_path):
    from safetensors.torch import load_file, save_file

    from eaglekit.targets.prepare import prepare_target

    source = load_target(targets["base"]).fingerprint()
    prepare_target(str(targets["base"]), tmp_path / "t", dtype="bfloat16")  # other bytes, same model
    assert without_name(load_target(tmp_path / "t").fingerprint()) == without_name(source)
    weights = tmp_path / "t" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(n for n in tensors if n.endswith("q_proj.weight"))
    tensors[name] = tensors[name] + 0.01  # fine-tuned in place
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert load_target(tmp_path / "t").fingerprint()["weights_hash"] != source["weights_hash"]


# ---- text input ----------------------------------------------------------------------------------


def test_a_lone_surrogate_is_a_malformed_record(targets, tmp_path, capsys):
    lines = [
        json.dumps({"id": "ok", "turns": ["What is 2 + 2?"]}),
        '{"id": "emoji", "turns": ["a broken emoji \\ud83d here"]}',
    ]
    prompts = prompt_file(tmp_path, lines)
    assert (
        main(["prompts", "build", "--source", str(prompts), "--out", str(tmp_path / "p"), "--validation-fraction", "0"])
        == 0
    )
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["counts"]["train"] == 1 and manifest["counts"]["malformed"] == 1
    assert "lone surrogate '\\ud83d'" in (tmp_path / "p" / "malformed.txt").read_text()
    # generate reads one file strictly, as for any malformed record: refused, nothing written
    assert generate(prompts, targets["base"], tmp_path / "gen") == 2
    assert "lone surrogate" in capsys.readouterr().err and not (tmp_path / "gen").exists()


@pytest.mark.parametrize("content", ["", "\n  \n\t\n"])
def test_an_empty_prompts_file_is_an_error(content, targets, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(content)
    assert generate(prompts, targets["base"], tmp_path / "gen") == 2
    assert "holds no prompts" in capsys.readouterr().err and not (tmp_path / "gen").exists()
    assert main(["prompts", "build", "--source", str(prompts), "--out", str(tmp_path / "p")]) == 2
    assert "holds no records" in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_generate_refuses_a_template_it_cannot_mask_before_generating(targets, tmp_path, capsys):
    target = tmp_path / "plain"
    shutil.copytree(targets["base"], target)
    (target / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    assert generate(prompt_file(tmp_path), target, tmp_path / "gen") == 2
    err = capsys.readouterr().err
    assert "chat template cannot mark the assistant's tokens" in err and not (tmp_path / "gen").exists()


def test_a_torn_json_line_is_reported_once_with_its_column(tmp_path):
    from eaglekit.data.readers import SourceSpec, read_source

    path = prompt_file(tmp_path, [json.dumps({"turns": ["fine"]}), '{"turns": ["cut here'])
    report = read_source(SourceSpec.parse(str(path)))
    # json says "Invalid control character at" (the line's newline inside the open string): one "at"
    assert report.malformed == [f"{path}:2: invalid JSON (Invalid control character at column 21)"]


def test_server_url_credentials_are_never_printed(caplog):
    from eaglekit.data.openai_backend import OpenAIClient

    client = OpenAIClient("http://user:s3cret@127.0.0.1:9", max_retries=1, backoff=0.0, timeout=2)
    with caplog.at_level(logging.WARNING), pytest.raises(EaglekitError) as err:
        client.request("GET", "/v1/models")
    assert "http://***@127.0.0.1:9" in str(err.value)
    assert "s3cret" not in str(err.value) + caplog.text and "user" not in str(err.value)
    assert client.basic_auth is not None  # sent as basic auth, not dropped


def test_target_prepare_writes_files_readable_by_others(targets, tmp_path):
    from eaglekit.targets.prepare import prepare_target

    old = os.umask(0o022)
    try:
        prepare_target(str(targets["base"]), tmp_path / "t")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "t").iterdir()}
    assert set(modes.values()) == {0o644}, modes


def test_a_misspelled_recipe_key_is_refused_before_anything_runs(targets, tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\ntarget: {targets['base']}\n")
    assert (
        main(
            [
                "run",
                "--recipe",
                str(recipe),
                "--out",
                str(tmp_path / "runs"),
                "--stop-before",
                "prompts",
                "train.epochz=3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "train.epochz is not an option of `eaglekit train`" in err and "did you mean train.epochs?" in err
    assert not (tmp_path / "runs").exists()


# ---- a finished folder changed after the fact ----------------------------------------------------


def test_a_finished_conversations_folder_cut_short_or_missing_a_shard_is_refused(targets, tmp_path, capsys):
    """Found 2026-12-04: a shard cut from 3 conversations to 1 was read as the data (features exit 0
    on 1 of 3), and rerunning generate said "already complete" over it; a lost shard went unseen."""
    prompts, out = prompt_file(tmp_path), tmp_path / "conv"
    assert generate(prompts, targets["base"], out, "--shard-size", "2") == 0
    shards = sorted(out.glob("conversations-*.jsonl"))
    assert len(shards) == 2
    first = shards[0].read_text().splitlines(keepends=True)
    shards[0].write_text(first[0])  # cut at a line boundary: valid JSONL
    features = [
        "features",
        "--target",
        str(targets["base"]),
        "--data",
        str(out),
        "--out",
        str(tmp_path / "feat"),
        "--device",
        "cpu",
        "--no-progress",
        "--teacher-topk",
        "8",
    ]
    capsys.readouterr()
    assert main(features) == 2
    err = capsys.readouterr().err
    assert "holds 2 conversations, its manifest counted 3" in err and "eaglekit generate --overwrite" in err
    assert generate(prompts, targets["base"], out, "--shard-size", "2") == 2  # not "already complete"
    assert "holds 2 conversations, its manifest counted 3" in capsys.readouterr().err
    shards[0].write_text("".join(first))
    shards[1].unlink()
    assert main(features) == 2
    assert (
        "does not hold the shards its manifest lists (missing ['conversations-00001.jsonl']" in capsys.readouterr().err
    )
    assert generate(prompts, targets["base"], out, "--shard-size", "2", "--overwrite") == 0  # the fix it names
    assert main(features) == 0


def test_a_prompts_split_emptied_after_the_build_is_refused(targets, tmp_path, capsys):
    """An emptied train.jsonl (its manifest: 2 train prompts) gave a finished generate of the
    validation prompts alone."""
    folder = tmp_path / "prompts"
    assert (
        main(
            [
                "prompts",
                "build",
                "--source",
                str(prompt_file(tmp_path)),
                "--validation-fraction",
                "0.34",
                "--out",
                str(folder),
            ]
        )
        == 0
    )
    (folder / "train.jsonl").write_text("")
    capsys.readouterr()
    assert generate(folder, targets["base"], tmp_path / "conv") == 2
    err = capsys.readouterr().err
    assert "train.jsonl holds 0 prompts, the folder's manifest counted 2" in err and "rebuild it" in err
    assert not (tmp_path / "conv").exists() or not any((tmp_path / "conv").iterdir())


def test_a_prompts_folder_without_its_manifest_is_unfinished_not_raw_files(targets, tmp_path, capsys):
    """Read as a folder of raw prompt files, its validation split was answered as training data."""
    folder = tmp_path / "prompts"
    assert (
        main(
            [
                "prompts",
                "build",
                "--source",
                str(prompt_file(tmp_path)),
                "--validation-fraction",
                "0.34",
                "--out",
                str(folder),
            ]
        )
        == 0
    )
    (folder / "manifest.json").unlink()  # as a killed `prompts build` leaves it
    capsys.readouterr()
    assert generate(folder, targets["base"], tmp_path / "conv") == 2
    assert "rerun `eaglekit prompts` with the same --out" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["[]", '{"stage": "generate"}'])
def test_a_manifest_of_the_wrong_shape_is_one_clear_error(text, targets, tmp_path, capsys):
    """Valid JSON of another shape gave AttributeError / KeyError tracebacks."""
    out = tmp_path / "conv"
    assert generate(prompt_file(tmp_path), targets["base"], out) == 0
    (out / "manifest.json").write_text(text)
    capsys.readouterr()
    assert (
        main(
            [
                "features",
                "--target",
                str(targets["base"]),
                "--data",
                str(out),
                "--out",
                str(tmp_path / "f"),
                "--device",
                "cpu",
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "manifest.json is not an eaglekit manifest" in err and "make the folder again" in err


def test_a_malformed_message_in_conversations_is_named_by_file_line_and_id(targets, tmp_path, capsys):
    """It said only "message 1 is malformed", in which of thousands of conversations unsaid."""
    out = tmp_path / "conv"
    assert generate(prompt_file(tmp_path), targets["base"], out) == 0
    shard = sorted(out.glob("conversations-*.jsonl"))[0]
    lines = shard.read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["messages"][1]["content"] = None
    lines[1] = json.dumps(row) + "\n"
    shard.write_text("".join(lines))
    capsys.readouterr()
    assert (
        main(
            [
                "features",
                "--target",
                str(targets["base"]),
                "--data",
                str(out),
                "--out",
                str(tmp_path / "f"),
                "--device",
                "cpu",
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{shard}:2, conversation {row['id']!r}: message 1 is malformed" in err


# ---- numbers that measure nothing -------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, said",
    [
        (["bench", "--draft", "random", "--limit", "0"], "--limit 0: no prompt to bench"),
        (["bench", "--draft", "random", "--limit", "-2"], "--limit -2: no prompt to bench"),
        (["bench", "--draft", "random", "--max-new-tokens", "0"], "--max-new-tokens 0: nothing to generate"),
        (["speculate", "--draft", "random", "--max-new-tokens", "0", "hi"], "--max-new-tokens 0: nothing to generate"),
        (["doctor", "DRAFT", "--probe", "--limit", "0"], "--limit 0: the probe would measure nothing"),
        (
            ["doctor", "DRAFT", "--probe", "--max-new-tokens", "0"],
            "--max-new-tokens 0: the probe would measure nothing",
        ),
        (["bench", "--draft", "random", "--k", "0"], "--k 0: a chain drafts at least one token"),  # ran k=2
        (["speculate", "--draft", "random", "--k", "0", "hi"], "--k 0: a chain drafts at least one token"),
    ],
)
def test_a_count_that_measures_nothing_is_refused(argv, said, targets, tmp_path, capsys):
    """Found 2026-12-04: bench --limit 0 benched every prompt (0 read as "all"), --limit -1 all but
    the last, and the doctor's --limit 0 probed nothing and still printed a verdict."""
    argv = [str(tmp_path) if a == "DRAFT" else a for a in argv] + ["--target", str(targets["base"]), "--device", "cpu"]
    if argv[0] == "bench":
        argv += ["--out", str(tmp_path / "bench")]
    assert main(argv) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()


def test_a_bench_whose_answers_end_at_the_first_token_is_refused_not_scored(targets, tmp_path, capsys):
    """Found 2026-12-04: --max-new-tokens 1 ran no speculative cycle, and bench printed tau 1.00
    and a cycle cost made up from no cycle."""
    out = tmp_path / "bench"
    assert (
        main(
            [
                "bench",
                "--target",
                str(targets["base"]),
                "--draft",
                "random",
                "--max-new-tokens",
                "1",
                "--no-hf",
                "--limit",
                "1",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "no speculative cycle ran" in capsys.readouterr().err
    assert not (out / "results.json").exists()


def test_bench_and_doctor_out_on_another_stages_folder_are_refused(targets, tmp_path, capsys):
    """Found 2026-12-04: `bench --out DRAFT` and `doctor --out DRAFT` replaced the draft's manifest
    with their own (exit 0); the draft then read as another stage's folder."""
    draft = draft_folder(targets["base"], tmp_path / "draft")
    before = (draft / "manifest.json").read_bytes()
    assert (
        main(
            [
                "bench",
                "--target",
                str(targets["base"]),
                "--draft",
                str(draft),
                "--max-new-tokens",
                "4",
                "--no-hf",
                "--limit",
                "1",
                "--device",
                "cpu",
                "--out",
                str(draft),
            ]
        )
        == 2
    )
    assert "holds the output of `eaglekit train`" in capsys.readouterr().err
    assert main(["doctor", str(draft), "--target", str(targets["base"]), "--out", str(draft)]) == 2
    assert "holds the output of `eaglekit train`" in capsys.readouterr().err
    assert (draft / "manifest.json").read_bytes() == before


def test_export_and_import_refuse_a_d2t_of_absolute_ids(targets, tmp_path, capsys):
    """Found 2026-12-04: a d2t holding absolute target ids (engines add d2t to the draft id) passed
    export's reload check; speculate and bench then failed with an IndexError."""
    from safetensors.torch import load_file, save_file

    draft = draft_folder(targets["base"], tmp_path / "draft")
    weights = draft / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["d2t"] = torch.arange(tensors["d2t"].shape[0], dtype=torch.long)  # absolute ids, not offsets
    save_file(tensors, str(weights), metadata={"format": "pt"})
    for argv in (
        ["export", str(draft), "--format", "vllm", "--out", str(tmp_path / "vllm")],
        ["import", str(draft), "--out", str(tmp_path / "native")],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "d2t holds absolute target ids" in err and "d2t[i] = target_id[i] - i" in err
    assert not (tmp_path / "vllm").exists() and not (tmp_path / "native").exists()


def test_export_with_target_checks_a_draft_that_records_none(targets, tmp_path, capsys):
    """Found 2026-12-04: `export --target T` of a draft recording no target stamped it with T
    unchecked, though its aux layers were past T's last layer."""
    draft = save_draft(random_draft(load_target(targets["base"]).model, aux=[1, 3, 4]), tmp_path / "bare")
    shallow = save_tiny_target(tmp_path / "shallow", num_layers=3)
    assert (
        main(["export", str(draft), "--format", "vllm", "--target", str(shallow), "--out", str(tmp_path / "out")]) == 2
    )
    assert "aux" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert (
        main(
            ["export", str(draft), "--format", "vllm", "--target", str(targets["base"]), "--out", str(tmp_path / "ok")]
        )
        == 0
    )  # the target it fits is stamped


def test_the_report_notes_a_bench_prompts_file_edited_into_bad_json(tmp_path):
    """Found 2026-12-04: `eaglekit report` died with a raw JSONDecodeError when the bench's prompts
    file had been edited since; the page now renders and says the categories are unknown."""
    from eaglekit.report.collect import prompt_categories

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "code", "turns": ["x"]}\n{"id": "b", "turns": [\n')
    assert prompt_categories(str(prompts)) == ({}, prompt_categories(str(prompts))[1])
    assert "no longer read as JSON" in prompt_categories(str(prompts))[1]
    prompts.write_text('{"id": "a", "category": "code", "turns": ["x"]}\n')
    assert prompt_categories(str(prompts)) == ({"a": "code"}, "")


def test_the_doctors_probe_refuses_a_prompts_file_with_broken_lines(targets, tmp_path, capsys):
    """Found by a newcomer review, 2026-12-04: `doctor --probe FILE` dropped a broken line without a
    word and probed the rest (bench refuses the same file)."""
    draft = draft_folder(targets["base"], tmp_path / "draft")
    prompts = tmp_path / "probe.jsonl"
    prompts.write_text('{"turns": ["one"]}\n{"turns": ["two"\n{"turns": ["three"]}\n')
    assert main(["doctor", str(draft), "--target", str(targets["base"]), "--probe", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert "1 malformed record(s) in the probe's prompts" in err and "probe.jsonl:2" in err


def test_a_missing_draft_folders_hint_offers_only_what_the_command_takes(capsys):
    """Found by a newcomer review, 2026-12-04: `speculate --draft oracle` said "no draft folder oracle"
    with the hint "pass a draft folder, `oracle` or `random`" (only bench takes `oracle`)."""
    assert main(["speculate", "hi", "--draft", "oracle", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no draft folder oracle" in err and "`oracle`" not in err and "`random`" in err


def test_a_draft_given_as_the_target_and_a_target_as_the_draft_are_named(targets, tmp_path, capsys):
    """Found by a newcomer review, 2026-12-04: a draft as --target read as a tokenizer error (or a
    35-line LOAD REPORT and a size mismatch); a target as the draft as "the draft is incomplete"."""
    draft = draft_folder(targets["base"], tmp_path / "draft")
    assert main(["target", "info", "--target", str(draft)]) == 2
    assert f"{draft} is a draft folder (its config.json has draft_vocab_size), not a target" in capsys.readouterr().err
    assert main(["doctor", str(targets["base"]), "--target", str(targets["base"])]) == 2
    assert "holds a target model (LlamaForCausalLM" in capsys.readouterr().err


def test_the_doctors_probe_given_a_folder_reads_a_prompts_folder_and_names_any_other(targets, tmp_path, capsys):
    """Found by a newcomer review, 2026-12-04: `doctor --probe DRAFT_FOLDER` (the folder for the
    prompts) failed on "manifest.json holds a JSON object ... records=KEY"."""
    draft = draft_folder(targets["base"], tmp_path / "draft")
    assert main(["doctor", str(draft), "--target", str(targets["base"]), "--probe", str(draft)]) == 2
    assert "holds a 'train' artifact, expected 'prompts'" in capsys.readouterr().err
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps({"id": f"q{i}", "turns": [f"Question {i}?"]}) + "\n" for i in range(8)))
    assert (
        main(
            [
                "prompts",
                "build",
                "--source",
                str(source),
                "--validation-fraction",
                "0.5",
                "--out",
                str(tmp_path / "prompts"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        [
            "doctor",
            str(draft),
            "--target",
            str(targets["base"]),
            "--probe",
            str(tmp_path / "prompts"),
            "--limit",
            "2",
            "--max-new-tokens",
            "4",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and report["probe"]["prompts"] == 2  # read from the folder's validation split


def test_the_reliability_table_counts_its_rows_and_names_tests_that_exist():
    """docs/reliability.md's count line is its table's rows, and each row's tests are real test functions."""
    import re

    tests = Path(__file__).resolve().parents[1]
    doc = (tests.parent / "docs" / "reliability.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ") and not line.startswith(("| ---", "| fault |"))]
    counted = re.search(r"Counted: (\d+) cases; (\d+) handled", doc)
    assert counted and int(counted[1]) == int(counted[2]) == len(rows)
    missing = [
        f"{file}::{name}"
        for row in rows
        for file, name in re.findall(r"(test_\w+\.py)::(\w+)", row)
        if not any(f"def {name}(" in p.read_text() for p in tests.rglob(file))
    ]
    assert not missing


def test_generate_checks_its_counts_before_anything_loads(tmp_path, capsys):
    """`eaglekit generate --max-new-tokens 0` runs its options' checks itself, as `eaglekit run --plan`
    does for it (the target named here does not exist: the check comes first)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "turns": ["hi"]}) + "\n")
    code = main(
        [
            "generate",
            "--prompts",
            str(prompts),
            "--target",
            str(tmp_path / "no-target"),
            "--max-new-tokens",
            "0",
            "--out",
            str(tmp_path / "g"),
        ]
    )
    assert code == 2 and "--max-new-tokens 0 must be 1 or more" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()
