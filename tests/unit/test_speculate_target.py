"""`eaglekit speculate` runs a draft on the target its manifest records unless --target says otherwise
(found 2026-12-06: it loaded the default GGUF beside the run's own prepared target), and refuses a
--target the draft was not made for."""

import pytest

from eaglekit.artifacts import write_manifest
from eaglekit.cli import main
from engine_tiny import one_thread  # noqa: F401 (fixture)
from tiny import save_tiny_target

SHORT = ["--max-new-tokens", "4", "--device", "cpu", "--mode", "chain", "--k", "2", "--no-plain"]


@pytest.fixture()
def run_folder(tmp_path, monkeypatch):
    """A run folder as `eaglekit run --out run` leaves it, seen from the folder it ran in: run/target
    and run/draft, whose train manifest records `--target run/target`."""
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    monkeypatch.chdir(tmp_path)
    target_dir = save_tiny_target(tmp_path / "run" / "target", seed=0)
    target = load_target(target_dir)
    draft = save_draft(random_draft(target.model, aux=[1, 3, 4]), tmp_path / "run" / "draft")
    write_manifest(
        draft, stage="train", config={"target": "run/target", "out": "run/draft"}, target=target.fingerprint()
    )
    return tmp_path / "run"


def test_speculate_defaults_to_the_drafts_own_target(run_folder, tmp_path, monkeypatch, capsys):
    assert main(["speculate", "hi", "--draft", "run/draft", *SHORT]) == 0
    out = capsys.readouterr().out
    assert "[target: run/target, the draft's own (--target to override)]" in out and "tau" in out
    # from another folder: the recorded path is found relative to the run folder above the draft
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["speculate", "hi", "--draft", str(run_folder / "draft"), *SHORT]) == 0
    assert f"[target: {run_folder / 'target'}, the draft's own" in capsys.readouterr().out


def test_speculate_refuses_a_target_the_draft_was_not_made_for(run_folder, tmp_path, capsys):
    other = save_tiny_target(tmp_path / "tuned", seed=1)  # same config and tokenizer, other weights
    assert main(["speculate", "hi", "--draft", "run/draft", "--target", str(other), *SHORT]) == 2
    err = capsys.readouterr().err
    assert "was made for another target weights" in err and "pass the target it was made for" in err
    assert main(["speculate", "hi", "--draft", "run/draft", "--target", "run/target", *SHORT]) == 0  # the same, named


def test_speculate_says_so_when_the_recorded_target_is_gone(run_folder, capsys):
    import shutil

    shutil.rmtree(run_folder / "target")
    assert main(["speculate", "hi", "--draft", "run/draft", *SHORT]) == 2
    err = capsys.readouterr().err
    assert "was made for target run/target, which is not there" in err and "--target" in err


def test_the_recorded_target_of_each_kind_of_draft_folder(tmp_path):
    """A training run records its --target; an export or import carries its source's manifest; a
    fingerprint alone names a path only for the default target; a foreign folder records none."""
    from eaglekit.engine.cli import recorded_target_spec
    from eaglekit.formats.folder import DraftFolder

    def folder(manifest, config=None):
        return DraftFolder(path=tmp_path, config=config or {}, tensors={}, manifest=manifest)

    assert recorded_target_spec(folder({"stage": "train", "config": {"target": "runs/q/target"}})) == "runs/q/target"
    export = {
        "stage": "export",
        "config": {"source": "runs/q/draft"},
        "target": {"name": "target"},
        "source_manifest": {"stage": "train", "config": {"target": "/abs/target"}},
    }
    assert recorded_target_spec(folder(export)) == "/abs/target"
    assert recorded_target_spec(folder(None, {"eaglekit": {"target": {"name": "smollm2"}}})) == "smollm2"
    assert recorded_target_spec(folder(None, {"eaglekit": {"target": {"name": "my-model"}}})) is None
    assert recorded_target_spec(folder(None)) is None
