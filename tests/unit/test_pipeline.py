"""`eaglekit run` end to end on a tiny target: every stage, one folder, resumable."""

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import yaml

from eaglekit.cli import main
from eaglekit.errors import EaglekitError
from eaglekit.pipeline.recipe import apply_override, load_recipe, to_flags
from eaglekit.pipeline.run import PlannedStage, StageTime, TimeLeft, known_stage_time, planned_stages, run_time_left

PROMPTS = [
    "Count from one to ten.",
    "What is the capital of France?",
    "Write a function that adds two numbers.",
    "Hello! How can I help you today?",
    "Solve 12 * 7.",
    "Tell me about the quick brown fox.",
    "Name three colours.",
    "Why is the sky blue?",
]


def tiny_recipe(tmp_path, target) -> str:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "turns": [p]}) + "\n" for i, p in enumerate(PROMPTS)))
    recipe = {
        "name": "tiny",
        "target": str(target),
        "device": "cpu",
        "prompts": {"source": [str(prompts)], "validation-fraction": 0.25},
        "generate": {"max-new-tokens": 12, "batch-size": 4},
        "features": {"batch-tokens": 512},
        "train": {
            "draft-vocab-size": 64,
            "allow-smaller-vocab": True,
            "ttt-steps": 2,
            "epochs": 1,
            "batch-tokens": 256,
            "val-every": 5,
        },
        "export": {"formats": ["sglang", "vllm", "eagle"]},
        "doctor": {"engine": "vllm", "probe": "builtin", "limit": 2, "max-new-tokens": 8},
        "bench": {"mode": "chain", "k": 2, "max-new-tokens": 8, "limit": 2, "no-hf": True},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_run_chains_every_stage_and_resumes(tiny_target_dir, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    # --stop-before runs the data stages only; the full run then goes on from there.
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "train"]) == 0
    early = json.loads((out / "pipeline.json").read_text())
    assert list(early["stages"]) == ["target", "prompts", "generate", "features"]
    assert early["stopped_before"] == "train" and not (out / "draft").exists()
    assert "stopped before stage train" in capsys.readouterr().out
    code = main(["run", "--recipe", recipe, "--out", str(out)])
    printed = capsys.readouterr().out
    state = json.loads((out / "pipeline.json").read_text())
    assert "stopped_before" not in state
    assert {k: state["stages"][k]["seconds"] for k in early["stages"]} == {
        k: v["seconds"] for k, v in early["stages"].items()
    }  # not run again
    stages = [
        "target",
        "prompts",
        "generate",
        "features",
        "train",
        "export-sglang",
        "export-vllm",
        "export-eagle",
        "doctor",
        "bench",
    ]
    assert list(state["stages"]) == stages
    assert planned_stages(load_recipe(recipe), out) == stages  # the log's "stage k of N"
    assert "[bench] time left for the run not known yet: bench" in caplog.text  # nothing times a bench
    assert all(s["status"] == "done" for s in state["stages"].values())
    for folder in ("prompts", "conversations", "features", "draft", "export/vllm", "doctor", "bench"):
        assert (out / folder / "manifest.json").is_file(), folder
    # A random tiny draft is not accepted: the doctor must say so, and the run's exit status too.
    assert state["doctor_ok"] is False and code == 1
    assert "doctor: FAILED" in printed and "bench: tau" in printed
    manifest = json.loads((out / "draft" / "manifest.json").read_text())  # what it learned from, beside a bigram table
    assert f"data: the draft learned from {manifest['counts']['train_assistant_tokens']:,} answer tokens" in printed
    assert "for a bigram table of the same data" in printed
    # Rerunning the same command skips every finished stage.
    main(["run", "--recipe", recipe, "--out", str(out)])
    again = json.loads((out / "pipeline.json").read_text())
    assert {k: v["seconds"] for k, v in again["stages"].items()} == {
        k: v["seconds"] for k, v in state["stages"].items()
    }


def test_a_stage_whose_input_was_made_again_is_made_again(tiny_target_dir, tmp_path, caplog):
    """A second target into the same run folder: the target stage runs again (its command changed),
    and so must every stage reading what it made (their commands did not change; they were all
    skipped, and the run said "doctor: ok" over data, draft and exports of the first target)."""
    from eaglekit.pipeline.run import overwrites
    from tiny import save_tiny_target

    caplog.set_level(logging.INFO)
    out = tmp_path / "run"
    recipe = yaml.safe_load(open(tiny_recipe(tmp_path, tiny_target_dir)))
    recipe.pop("bench")
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(yaml.safe_dump(recipe))
    other = save_tiny_target(tmp_path / "other-target", "llama", seed=1)
    second.write_text(yaml.safe_dump({**recipe, "target": str(other)}))
    main(["run", "--recipe", str(first), "--out", str(out)])
    before = json.loads((out / "pipeline.json").read_text())["stages"]
    caplog.clear()
    main(["run", "--recipe", str(second), "--out", str(out)])
    after = json.loads((out / "pipeline.json").read_text())["stages"]
    assert caplog.text.count("done earlier, skipped") == 1 and "[prompts] done earlier, skipped" in caplog.text
    assert all(after[name]["ran"] > before[name]["ran"] for name in before if name != "prompts"), after
    assert after["prompts"]["ran"] == before["prompts"]["ran"]  # built without the target
    assert "[generate] target changed since this stage ran: its output is out of date" in caplog.text
    hashes = {
        folder: json.loads((out / folder / "manifest.json").read_text())["target"]["weights_hash"]
        for folder in ("target", "conversations", "features", "draft", "export/vllm")
    }
    assert len(set(hashes.values())) == 1, hashes
    caplog.clear()
    main(["run", "--recipe", str(second), "--out", str(out)])  # and nothing runs a third time
    assert caplog.text.count("done earlier, skipped") == len(after)
    assert overwrites(["prompts", "build"]) and overwrites(["target", "prepare"]) and not overwrites(["doctor"])
    # The user's prompts file edited in place: the prompts are built again, and what reads them.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(prompts.read_text().replace("Name three colours.", "Name four colours."))
    caplog.clear()
    main(["run", "--recipe", str(second), "--out", str(out)])
    assert f"[prompts] {prompts} changed since this stage ran" in caplog.text
    edited = json.loads((out / "pipeline.json").read_text())["stages"]
    assert all(edited[name]["ran"] > after[name]["ran"] for name in after if name != "target"), edited
    assert "Name four colours." in "".join(f.read_text() for f in (out / "prompts").glob("*.jsonl"))


def test_an_edited_recipe_runs_the_changed_stage_again(tiny_target_dir, tmp_path, caplog):
    """Found 2026-12-04: a recipe whose train settings changed ran train into its finished folder
    without --overwrite; train refused it (needs --resume or --overwrite) and the run dead-ended."""
    from eaglekit.pipeline.run import changed_args

    caplog.set_level(logging.INFO)
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 0
    before = json.loads((out / "pipeline.json").read_text())["stages"]
    caplog.clear()
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang", "train.lr=0.001"]) == 0
    after = json.loads((out / "pipeline.json").read_text())["stages"]
    assert "[train] its settings changed (--lr" in caplog.text and "runs again (--overwrite)" in caplog.text
    assert after["train"]["ran"] > before["train"]["ran"] and after["features"]["ran"] == before["features"]["ran"]
    assert "--lr" in after["train"]["argv"]
    assert changed_args(["train", "--lr", "1", "--x"], ["train", "--lr", "2"]) == ["--lr 1 -> 2", "--x on -> (unset)"]


def test_stop_before_an_unknown_stage_is_refused(tmp_path, capsys):
    assert main(["run", "--recipe", "quick", "--out", str(tmp_path / "run"), "--stop-before", "trian"]) == 2
    assert "no stage named 'trian'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_run_tops_prompts_up_with_magpie_and_trains_with_torchrun(tiny_target_dir, tmp_path):
    """`synthesize: {add: N}` adds N of the target's own Magpie prompts to the files; `validation`
    answers the workload's prompts for training to validate on; `gpus: 2` runs the train stage under
    torchrun (two gloo processes on CPU)."""
    recipe = yaml.safe_load(open(tiny_recipe(tmp_path, tiny_target_dir)))
    recipe.update(
        gpus=2,
        synthesize={"add": 3, "batch-size": 64, "max-new-tokens": 24, "min-chars": 1, "max-attempts": 640, "seed": 0},
    )  # a random model rarely ends a turn
    workload = tmp_path / "workload.jsonl"
    workload.write_text(
        "".join(
            json.dumps({"id": f"w{i}", "turns": [p, "And why?"]}) + "\n"
            for i, p in enumerate(["Describe a sunset.", "Plan a trip to Rome."])
        )
    )
    recipe["validation"] = {"source": [str(workload)]}
    recipe.pop("bench")
    path, out = tmp_path / "two.yaml", tmp_path / "run2"
    path.write_text(yaml.safe_dump(recipe))
    main(["run", "--recipe", str(path), "--out", str(out)])
    state = json.loads((out / "pipeline.json").read_text())
    assert list(state["stages"])[:3] == ["target", "prompts", "synthesize"]
    counts = json.loads((out / "prompts" / "manifest.json").read_text())["counts"]
    assert counts["train"] + counts["validation"] == len(PROMPTS) + 3
    assert state["stages"]["train"]["status"] == "done"
    draft = json.loads((out / "draft" / "manifest.json").read_text())
    assert draft["world_size"] == 2
    # training validated on the workload's own answered prompts (2 conversations, 2 turns each)
    assert {"val-prompts", "val-generate", "val-features"} <= set(state["stages"])
    assert draft["inputs"]["val_data"] is not None and draft["counts"]["val_samples"] == 2
    bad = dict(recipe, gpus=0)
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(EaglekitError, match="gpus"):
        load_recipe(str(path))


def test_magpie_alone_takes_its_count_from_synthesize_add(tmp_path, monkeypatch):
    from eaglekit.pipeline import run as pipeline_run

    calls = []
    monkeypatch.setattr(pipeline_run, "run_eaglekit", lambda argv, processes=1: calls.append(argv) or 0)
    pipe = pipeline_run.Pipeline({}, tmp_path)
    recipe = {"prompts": {}, "synthesize": {"add": 7, "batch-size": 4}}
    pipeline_run.prompt_stages(pipe, recipe, tmp_path, ["--target", "T"], [])
    assert calls == [
        [
            "prompts",
            "synthesize",
            "--target",
            "T",
            "--num-prompts",
            "7",
            "--batch-size",
            "4",
            "--out",
            str(tmp_path / "prompts"),
            "--overwrite",
        ]
    ]


def test_gpus_spread_generation_over_devices():
    from eaglekit.pipeline.run import generate_flags

    recipe = {"device": "cuda", "gpus": 2, "generate": {"batch-size": 8}}
    assert generate_flags(recipe) == ["--batch-size", "8", "--devices", "cuda:0,cuda:1"]
    assert generate_flags(dict(recipe, gpus=1)) == ["--batch-size", "8"]
    assert generate_flags(dict(recipe, device="cpu")) == ["--batch-size", "8"]
    mine = dict(recipe, generate={"devices": "cuda:1"})
    assert generate_flags(mine) == ["--devices", "cuda:1"]


def test_overrides_and_flags():
    recipe = {"train": {"epochs": 1}}
    apply_override(recipe, "train.epochs=3")
    apply_override(recipe, "generate.batch-size=64")
    assert recipe == {"train": {"epochs": 3}, "generate": {"batch-size": 64}}
    assert to_flags({"max-new-tokens": 8, "no-hf": True, "skip": False, "source": ["a", "b"]}) == [
        "--max-new-tokens",
        "8",
        "--no-hf",
        "--source",
        "a",
        "--source",
        "b",
    ]
    with pytest.raises(EaglekitError, match="key=value"):
        apply_override(recipe, "train.epochs")


def test_builtin_recipes_parse_and_unknown_ones_are_refused(tmp_path):
    for name in ("quick", "smollm2-h200"):
        assert load_recipe(name)["target"] == "smollm2"
    with pytest.raises(EaglekitError, match="no recipe"):
        load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trian: {epochs: 1}\n")
    with pytest.raises(EaglekitError, match="unknown sections"):
        load_recipe(str(bad))


def test_time_left_is_about_only_when_every_stage_is_timed():
    assert run_time_left([("train", StageTime(200)), ("bench", StageTime(70))]).text() == "about 4m30s left for the run"
    # A time budget is a floor (start-up comes on top); a stage nothing times makes the sum a floor too.
    assert run_time_left([("train", StageTime(480, floor=True))]).text() == "at least 8m00s left for the run"
    left = run_time_left(
        [("generate", None), ("train", StageTime(480, floor=True)), ("bench", None)],
        "the scaling slices (planned once train is done)",
    )
    assert left == TimeLeft(480, True, ("generate", "bench", "the scaling slices (planned once train is done)"))
    assert left.text() == (
        "at least 8m00s left for the run; not known yet: generate, bench, "
        "the scaling slices (planned once train is done)"
    )
    assert (
        run_time_left([("generate", None), ("features", None)]).text()
        == "time left for the run not known yet: generate, features"
    )


def test_known_stage_times_come_from_a_budget_or_a_like_stage_that_ran(tmp_path):
    train = PlannedStage("train", ["train", "--time-budget-s", "480", "--out", "d"])
    assert known_stage_time(train, {"stages": {}}, tmp_path) == StageTime(480, floor=True)
    slice_train = PlannedStage("scaling-0.5-train", ["train", "--max-steps", "100", "--out", "s"])
    slice_bench = PlannedStage("scaling-0.5-bench", ["bench", "--out", "b"])
    empty = {"stages": {}}
    assert (
        known_stage_time(slice_train, empty, tmp_path) is None
        and known_stage_time(slice_bench, empty, tmp_path) is None
    )
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "manifest.json").write_text(json.dumps({"steps": {"done": 400}}))
    state = {"stages": {"train": {"status": "done", "seconds": 600.0}, "bench": {"status": "done", "seconds": 90.0}}}
    assert known_stage_time(slice_train, state, tmp_path) == StageTime(150.0)  # 1.5 s a step, 100 steps
    assert known_stage_time(slice_bench, state, tmp_path) == StageTime(90.0)
    state["stages"]["train"]["resumed"] = True  # its seconds are only the part after the resume
    assert known_stage_time(slice_train, state, tmp_path) is None
    assert known_stage_time(PlannedStage("doctor", ["doctor"]), state, tmp_path) is None


def test_run_logs_its_time_left_at_each_stage_and_in_progress_lines(tmp_path, monkeypatch, caplog):
    """Stages faked: each start says the run's time left, a stage's progress lines too, and the
    scaling slices (unplanned until the main draft's steps are known) are named as not known yet."""
    from eaglekit.pipeline import run as pipeline_run
    from eaglekit.progress import Progress

    def fake_stage(argv, processes=1):
        if argv[0] == "generate":
            Progress(4, desc="generate", unit="prompt", every_s=0, bar=False).update(2)
        if argv[0] == "train" and "--train-fraction" not in argv:
            draft = Path(argv[argv.index("--out") + 1])
            draft.mkdir(parents=True)
            (draft / "manifest.json").write_text(json.dumps({"steps": {"done": 10}}))
        return 0

    monkeypatch.setattr(pipeline_run, "run_eaglekit", fake_stage)
    recipe = {
        "target": "T",
        "prepare": False,
        "prompts": {"source": ["p.jsonl"]},
        "train": {"time-budget-s": 600},
        "export": {"formats": ["vllm"]},
        "bench": {"k": 2},
        "scaling": {"fractions": [0.5, 1.0]},
    }
    caplog.set_level(logging.INFO)
    pipe = pipeline_run.Pipeline(recipe, tmp_path)
    pipe.whole_plan, pipe.plan_is_whole = pipeline_run.plan_so_far(recipe, tmp_path)
    assert not pipe.plan_is_whole
    pipeline_run.run_stages(pipe, recipe, tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    at_start = {m.group(1): m.group(2) for m in (re.match(r"\[(\S+)\] (.*for the run.*)", line) for line in lines) if m}
    assert at_start["prompts"] == (
        "at least 10m00s left for the run; not known yet: prompts, generate, features, "
        "export-vllm, doctor, bench, the scaling slices (planned once train is done)"
    )
    progress = next(line for line in lines if line.startswith("generate: 2/4 prompts"))
    assert re.search(r" left \| at least 10m00s left for the run; not known yet: features, export-vllm", progress)
    assert at_start["train"].startswith("at least 10m00s left for the run; not known yet: export-vllm, doctor")
    # once the main draft is done the slices are planned: their trainings are timed by its seconds a step
    assert "scaling-0.5-train" not in at_start["export-vllm"] and "scaling-0.5-bench" in at_start["export-vllm"]
    assert at_start["scaling-1-bench"].startswith("about ")  # the main bench's time times it


def test_an_override_of_the_form_a_colon_b_stays_as_written():
    """YAML 1.1 reads 10:20 as a base-60 number (620); `train.profile-steps=10:20` must reach train as 10:20."""
    from eaglekit.pipeline.recipe import apply_override

    recipe = {}
    for text in ("train.profile-steps=10:20", "train.epochs=3", "bench.limit=1:30.5"):
        apply_override(recipe, text)
    assert recipe == {"train": {"profile-steps": "10:20", "epochs": 3}, "bench": {"limit": "1:30.5"}}
    apply_override(recipe, "prompts.source=[a.jsonl, 10:20]")
    assert recipe["prompts"]["source"] == ["a.jsonl", "10:20"]


def test_generation_past_training_s_max_length_is_said(caplog):
    """The stage that truncates for training is asked: train online, features offline (moe-tp8
    trains offline on 8,192 tokens, and must not be told to cut generation to train's 2,048)."""
    from eaglekit.pipeline.recipe import load_recipe
    from eaglekit.pipeline.run import warn_past_training

    caplog.set_level(logging.WARNING)
    for name in ("smollm2-h200", "moe-tp8", "quick"):
        warn_past_training(load_recipe(name))
    assert "training reads the first" not in caplog.text  # the recipes generate what training reads
    warn_past_training({"generate": {"context-length": 4096}, "features": False})
    assert "conversations of 4096 tokens, training reads the first 2048 of each (train.max-length)" in caplog.text
    caplog.clear()
    warn_past_training({"generate": {"context-length": 4096}, "features": {"max-length": 1024}})
    assert "training reads the first 1024 of each (features.max-length)" in caplog.text


def test_the_doctor_s_probe_runs_on_the_run_s_device(tmp_path):
    """`device=cuda:1` reaches the doctor stage as every other stage (the recipe had to repeat it, and
    an override left the probe on cuda:0); the doctor section's own device still wins."""
    from eaglekit.pipeline.recipe import apply_override, load_recipe
    from eaglekit.pipeline.run import planned

    recipe = load_recipe("smollm2-h200")
    apply_override(recipe, "device=cuda:1")
    doctor = next(s for s in planned(recipe, tmp_path) if s.name == "doctor")
    assert doctor.argv[doctor.argv.index("--device") + 1] == "cuda:1" and doctor.argv.count("--device") == 1
    apply_override(recipe, "doctor.device=cpu")
    doctor = next(s for s in planned(recipe, tmp_path) if s.name == "doctor")
    assert doctor.argv[doctor.argv.index("--device") + 1] == "cpu" and doctor.argv.count("--device") == 1


def test_a_training_stopped_before_it_saved_a_state_starts_again(tiny_target_dir, tmp_path, caplog):
    """Found by a newcomer review, 2026-12-04: the quick recipe interrupted in training (60 steps,
    a resume state every 200) left a partial log and no state; the same command then died on
    "draft is not empty". Now it starts training again, and the quick recipe saves every 20 steps."""
    from eaglekit.artifacts import TRAINER_STATE

    caplog.set_level(logging.INFO)
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 0
    state = json.loads((out / "pipeline.json").read_text())
    state["stages"]["train"]["status"] = "failed"  # as an interruption leaves it
    (out / "pipeline.json").write_text(json.dumps(state))
    (out / "draft" / "manifest.json").unlink()
    shutil.rmtree(out / "draft" / TRAINER_STATE, ignore_errors=True)
    assert (out / "draft" / "log.jsonl").exists()  # the partial log is all that is left
    caplog.clear()
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 0
    assert "[train] stopped earlier before it saved a state to resume from: it starts again" in caplog.text
    assert json.loads((out / "pipeline.json").read_text())["stages"]["train"]["status"] == "done"
    assert (out / "draft" / "manifest.json").is_file()
    assert load_recipe("quick")["train"]["save-every"] < 60


def test_a_stage_that_refuses_its_options_or_crashes_is_recorded_as_failed(
    tiny_target_dir, tmp_path, capsys, monkeypatch
):
    """Found by a newcomer review, 2026-12-04: `train.lr=abc` ran 5 minutes of data stages, then
    argparse's exit (and any crash that is not an EaglekitError) left pipeline.json saying "running",
    with no "stage failed" line. Values a stage's parser refuses are now refused before the run."""
    from eaglekit.pipeline import run as pipeline_run

    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    for value in ("train.lr=abc", "bench.mode=trie"):  # refused by their parsers before anything runs
        assert main(["run", "--recipe", recipe, "--out", str(out), value]) == 2
        assert "would be refused" in capsys.readouterr().err and not (out / "prompts").exists()
        assert main(["run", "--recipe", recipe, "--out", str(out), "--plan", value]) == 2
        assert "would be refused" in capsys.readouterr().err
    real = pipeline_run.run_eaglekit

    def refusing(argv, processes=1):  # what only the stage itself can refuse
        if argv[0] == "train":
            raise SystemExit(2)
        return real(argv, processes)

    monkeypatch.setattr(pipeline_run, "run_eaglekit", refusing)
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 2
    assert "stage train failed (exit 2: its options were refused (above))" in capsys.readouterr().err
    assert json.loads((out / "pipeline.json").read_text())["stages"]["train"]["status"] == "failed"

    def crashing(argv, processes=1):
        if argv[0] == "train":
            raise RuntimeError("a bug")
        return real(argv, processes)

    monkeypatch.setattr(pipeline_run, "run_eaglekit", crashing)
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 2
    assert "stage train failed (exit 1: RuntimeError: a bug)" in capsys.readouterr().err
    assert json.loads((out / "pipeline.json").read_text())["stages"]["train"]["status"] == "failed"
    monkeypatch.setattr(
        pipeline_run, "run_eaglekit", lambda argv, processes=1: 130 if argv[0] == "train" else real(argv)
    )
    assert main(["run", "--recipe", recipe, "--out", str(out), "--stop-before", "export-sglang"]) == 2
    err = capsys.readouterr().err  # Ctrl-C: rerun, not "fix the cause"
    assert "interrupted in stage train" in err and "rerun the same `eaglekit run` command" in err


def test_the_quick_recipe_given_prompt_files_names_its_magpie_keys(tmp_path, capsys):
    """Found by a newcomer review, 2026-12-04: `eaglekit run --recipe quick prompts.source=FILE` said
    only "prompts.max-new-tokens is not an option of `eaglekit prompts build`", a key the user never
    set. It now says why (a Magpie key) and how to drop or move it; KEY=null drops a key."""
    source = tmp_path / "p.jsonl"
    source.write_text('{"turns": ["hi"]}\n')
    assert main(["run", "--recipe", "quick", "--plan", "--out", str(tmp_path / "r"), f"prompts.source={source}"]) == 2
    err = capsys.readouterr().err
    assert "prompts.max-new-tokens is a Magpie option" in err and "synthesize.max-new-tokens" in err
    assert (
        main(
            [
                "run",
                "--recipe",
                "quick",
                "--plan",
                "--out",
                str(tmp_path / "r"),
                f"prompts.source={source}",
                "prompts.max-new-tokens=null",
                "prompts.num-prompts=null",
                "prompts.batch-size=null",
            ]
        )
        == 0
    )
    assert f"eaglekit prompts build --source {source}" in capsys.readouterr().out


def test_a_doctor_reading_an_export_no_stage_writes_is_refused_before_the_run(tiny_target_dir, tmp_path, capsys):
    """Found by a newcomer review, 2026-12-04: `export.formats=[sglang]` planned the (vLLM) doctor on
    export/vllm, which no stage writes: the run would have failed at its end."""
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    for argv in (["--plan"], []):
        assert main(["run", "--recipe", recipe, "--out", str(out), *argv, "export.formats=[sglang]"]) == 2
        assert "the doctor reads the vllm export" in capsys.readouterr().err
    assert not (out / "prompts").exists()


def test_a_run_folder_moved_elsewhere_goes_on_where_it_was(tiny_target_dir, tmp_path, caplog):
    """A finished run folder moved (`mv runs/tiny /data/tiny`) ran every stage again: pipeline.json's
    commands named the old folder, so none matched the plan. Paths inside the run folder now read as
    in the folder it is in; the user's files outside it are still compared as given."""
    from eaglekit.pipeline.run import Pipeline, finished, planned

    caplog.set_level(logging.INFO)
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    main(["run", "--recipe", recipe, "--out", str(out)])
    before = json.loads((out / "pipeline.json").read_text())["stages"]
    moved = tmp_path / "elsewhere" / "moved-run"
    moved.parent.mkdir()
    shutil.move(out, moved)
    stages = planned(load_recipe(recipe), moved)
    state = Pipeline(load_recipe(recipe), moved).state  # what `eaglekit run` judges the stages on
    assert [s.name for s in stages] == list(before)
    assert all(finished(state, s.name, s.argv, moved) for s in stages)
    caplog.clear()
    main(["run", "--recipe", recipe, "--out", str(moved)])
    after = json.loads((moved / "pipeline.json").read_text())
    assert caplog.text.count("done earlier, skipped") == len(before), caplog.text
    assert {k: v["ran"] for k, v in after["stages"].items()} == {k: v["ran"] for k, v in before.items()}
    assert after["run_dir"] == str(moved) and str(out) not in json.dumps(after["stages"])
    # Another prompts file outside the folder: the prompts are built again, and every stage after them.
    other = tmp_path / "other-prompts.jsonl"
    other.write_text((tmp_path / "prompts.jsonl").read_text().replace("Name three colours.", "Name four colours."))
    caplog.clear()
    main(["run", "--recipe", recipe, "--out", str(moved), f"prompts.source=[{other}]"])
    again = json.loads((moved / "pipeline.json").read_text())["stages"]
    assert "[target] done earlier, skipped" in caplog.text and caplog.text.count("done earlier, skipped") == 1
    assert f"[prompts] {other} changed since this stage ran" in caplog.text
    assert all(again[k]["ran"] > before[k]["ran"] for k in before if k != "target"), again


def test_an_interrupted_training_resumes_in_a_copied_run_folder(tiny_target_dir, tmp_path, caplog, monkeypatch):
    """Ctrl-C in training, the run folder copied (`cp -r`), the same command on the copy: the stages
    before train are skipped and train resumes from its saved state (it was planned again from the
    start, and `train --resume` refused the new folder's --target and --features paths)."""
    from eaglekit.train.loop import Trainer

    caplog.set_level(logging.INFO)
    recipe, out = tiny_recipe(tmp_path, tiny_target_dir), tmp_path / "run"
    flags = ["--stop-before", "export-sglang", "train.epochs=3", "train.save-every=2"]
    save = Trainer.save_trainer_state

    def save_then_stop(self):
        save(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "save_trainer_state", save_then_stop)
    assert main(["run", "--recipe", recipe, "--out", str(out), *flags]) == 2
    monkeypatch.undo()
    assert json.loads((out / "pipeline.json").read_text())["stages"]["train"]["status"] == "failed"
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    caplog.clear()
    assert main(["run", "--recipe", recipe, "--out", str(copy), *flags]) == 0
    assert caplog.text.count("done earlier, skipped") == 4, caplog.text  # target, prompts, generate, features
    assert f"--out {copy / 'draft'} --resume" in caplog.text
    resumed = re.search(r"resumed \S+ at step 2 of (\d+)", caplog.text)
    assert resumed and int(resumed[1]) > 2, caplog.text
    state = json.loads((copy / "pipeline.json").read_text())["stages"]
    assert state["train"]["status"] == "done" and state["train"]["resumed"]


def test_moved_here_rewrites_only_paths_inside_the_old_run_folder():
    from eaglekit.pipeline.run import moved_here

    argv = [
        "generate",
        "--prompts",
        "runs/a/prompts",
        "--target",
        "/models/t",
        "--extra",
        "runs/a-notes.jsonl",
        "--out",
        "runs/a/conversations",
    ]
    recorded = {"run_dir": "runs/a", "stages": {"generate": {"argv": argv}}}
    assert moved_here(json.loads(json.dumps(recorded)), Path("/data/b"))["stages"]["generate"]["argv"] == [
        "generate",
        "--prompts",
        "/data/b/prompts",
        "--target",
        "/models/t",
        "--extra",
        "runs/a-notes.jsonl",
        "--out",
        "/data/b/conversations",
    ]
    legacy = {
        "stages": {
            "target": {"argv": ["target", "prepare", "--out", "runs/a/target"]},
            "export-vllm": {"argv": ["export", "runs/a/draft", "--out", "runs/a/export/vllm"]},
        }
    }
    state = moved_here(legacy, Path("/data/b"))  # recorded before run_dir: found from the outputs
    assert state["run_dir"] == "/data/b"
    assert state["stages"]["export-vllm"]["argv"] == ["export", "/data/b/draft", "--out", "/data/b/export/vllm"]
    assert state["stages"]["target"]["argv"][-1] == "/data/b/target"


def test_a_refused_command_changes_nothing_and_a_deleted_output_is_made_again(
    tiny_target_dir, tmp_path, capsys, caplog
):
    """Issue 41: a stage that refused its input (exit 2) was recorded with the refused command, so the
    next plain run said "settings changed" and its --overwrite emptied the finished draft; and a
    draft/model.safetensors or export/vllm deleted by hand still read "done earlier, skipped"."""
    caplog.set_level(logging.INFO)
    recipe = yaml.safe_load(open(tiny_recipe(tmp_path, tiny_target_dir)))
    recipe["export"] = {"formats": ["vllm"]}
    path, out = tmp_path / "vllm-only.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(recipe))
    args = ["run", "--recipe", str(path), "--out", str(out), "--stop-before", "doctor"]
    assert main(args) == 0
    state = json.loads((out / "pipeline.json").read_text())["stages"]
    weights = (out / "draft" / "model.safetensors").read_bytes()
    capsys.readouterr()
    # A value only train itself can refuse (the file is read when it runs): it runs with --overwrite.
    assert main([*args, f"train.init-from={tmp_path / 'no-such-draft'}"]) == 2
    assert "its earlier output and record are kept as they were" in capsys.readouterr().err
    assert json.loads((out / "pipeline.json").read_text())["stages"] == state
    assert (out / "draft" / "model.safetensors").read_bytes() == weights
    assert not [p.name for p in out.rglob(".*") if p.is_dir()]  # nothing hidden left behind
    caplog.clear()
    assert main(args) == 0
    assert caplog.text.count("done earlier, skipped") == len(state) and "settings changed" not in caplog.text
    # Outputs deleted by hand: the stages that made them run again, and what reads them.
    (out / "draft" / "model.safetensors").unlink()
    shutil.rmtree(out / "export" / "vllm")
    caplog.clear()
    assert main(args) == 0
    assert (
        f"[train] its output no longer matches its manifest ({out / 'draft' / 'model.safetensors'} is missing)"
        in caplog.text
    )
    assert "runs again (--overwrite)" in caplog.text
    after = json.loads((out / "pipeline.json").read_text())["stages"]
    assert after["train"]["ran"] > state["train"]["ran"] and after["export-vllm"]["ran"] > state["export-vllm"]["ran"]
    assert after["features"]["ran"] == state["features"]["ran"]
    assert (out / "draft" / "model.safetensors").is_file() and (out / "export" / "vllm" / "manifest.json").is_file()
    # An edited recipe's `train --overwrite` SIGKILLed mid-run: the old draft waits beside the folder.
    from eaglekit.pipeline.run import planned
    from processes import dead_pid

    argv = next(s.argv for s in planned(load_recipe(str(path), ["train.lr=0.002"]), out) if s.name == "train")
    state = json.loads((out / "pipeline.json").read_text())
    state["stages"]["train"].update(argv=argv, status="running", extra=["--overwrite"])
    (out / "pipeline.json").write_text(json.dumps(state))
    (out / "draft").rename(out / f".draft.old-{dead_pid()}")
    (out / "draft" / "trainer_state").mkdir(parents=True)  # the killed run's own state
    caplog.clear()
    assert main([*args, "train.lr=0.002"]) == 0
    assert "[train] an earlier run replacing its output stopped before the end" in caplog.text
    assert json.loads((out / "draft" / "manifest.json").read_text())["config"]["lr"] == 0.002
    assert not [p.name for p in out.rglob(".*") if p.is_dir()]


def test_a_recipe_with_a_duplicate_key_or_a_section_of_the_wrong_type_names_the_line(tmp_path):
    """Issue 41: a second `train:` replaced the first without a word; `train: 5` was an AttributeError."""
    cases = {
        "name: x\ntrain:\n  lr: 0.1\ngenerate: {max-new-tokens: 4}\ntrain:\n  epochs: 2\n": "line 5: 'train' is given twice (first at line 2)",
        "name: x\ntrain:\n  lr: 0.1\n  lr: 0.2\n": "line 4: 'lr' is given twice (first at line 3)",
        "name: x\ntrain: 5\n": "line 2: train must be a section, a mapping of its keys; got int 5",
        "name: x\ntrain:\n  epochs: 1\n  lr: {a: 1}\n": "line 4: train.lr must be a value or a list of values",
    }
    for text, said in cases.items():
        path = tmp_path / "recipe.yaml"
        path.write_text(text)
        with pytest.raises(EaglekitError, match=re.escape(said)):
            load_recipe(str(path))
    with pytest.raises(EaglekitError, match="generate must be a section"):
        load_recipe("quick", ["generate=5"])
    assert load_recipe("quick", ["features=false"])["features"] is False  # online training stays a switch


@pytest.mark.parametrize(
    "override, said",
    [
        (
            "train.batch-tokens=-5",
            "stage train would be refused: grad_accum, batch_tokens and max_length must be positive",
        ),
        ("generate.max-new-tokens=0", "stage generate would be refused: --max-new-tokens 0 must be 1 or more"),
        ("generate.batch-size=0", "stage generate would be refused: --batch-size 0 must be 1 or more"),
        ("doctor.limit=0", "stage doctor would be refused: --limit 0: the probe would measure nothing"),
    ],
)
def test_plan_checks_every_value_as_its_stage_would(override, said, tmp_path, capsys):
    """Issue 41: `--plan` accepted values the stage refuses only when it runs (after the data stages)."""
    assert main(["run", "--recipe", "quick", "--plan", "--out", str(tmp_path / "r"), override]) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_recipe_training_eagle31_norms_for_an_export_without_them_is_refused_before_anything_runs(tmp_path):
    """EAGLE's code has no EAGLE-3.1 norms: `train.fc-norm` with the eagle export would fail at the export
    stage, after the whole run; the recipe is refused at once, naming the export to drop."""
    from eaglekit.pipeline.recipe import apply_override, load_recipe
    from eaglekit.pipeline.run import check_layout_export, run_pipeline

    check_layout_export(load_recipe("smollm2-h200"))  # the norms, exported for SGLang and vLLM only
    recipe = load_recipe("quick")
    check_layout_export(recipe)  # no norms: every format
    apply_override(recipe, "train.norm-output=true")
    with pytest.raises(
        EaglekitError, match="train.norm-output trains EAGLE-3.1's norms, which the eagle export"
    ) as err:
        run_pipeline(recipe, tmp_path / "run")
    assert "export.formats=['sglang', 'vllm']" in err.value.hint
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    apply_override(recipe, "export.formats=[sglang, vllm]")
    check_layout_export(recipe)
