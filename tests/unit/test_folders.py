"""Nothing a user owns is ever deleted (issue 41): a stage writes only into an empty folder or one it
made, `--overwrite` replaces a result only once the new one is complete, and what a killed replace
left beside a folder is put back or finished by the next writer. Tiny folders, no models, except
where a command's own refusal is the point."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from eaglekit.artifacts import (
    MANIFEST,
    atomic_dir,
    check_owner,
    clear_folder,
    missing_outputs,
    write_manifest,
    writer_lock,
)
from eaglekit.cli import main
from eaglekit.errors import EaglekitError
from processes import dead_pid


def users_folder(path: Path) -> Path:
    (path / "src").mkdir(parents=True)
    (path / "important.txt").write_text("mine")
    (path / "src" / "main.rs").write_text("fn main() {}")
    return path


def finished(folder: Path, stage: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_text(text)
    write_manifest(folder, stage=stage, config={}, target=None)
    return folder


def hidden_beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith("."))


# ---- 1. a stage writes only into an empty folder or one it made -----------------------------------


@pytest.mark.parametrize(
    "stage", ["target prepare", "prompts", "generate", "features", "train", "export", "doctor", "run"]
)
def test_every_stage_refuses_a_folder_of_the_users_own_files(stage, tmp_path):
    out = users_folder(tmp_path / "out")
    with pytest.raises(
        EaglekitError, match=r"holds files .* did not write \(important.txt, src\).*--overwrite included"
    ):
        with writer_lock(out, stage=stage):
            clear_folder(out)  # what --overwrite did: deleted both files, exit 0
    with pytest.raises(EaglekitError, match="did not write"):
        with atomic_dir(out, overwrite=True, stage=stage):
            pass
    assert (out / "important.txt").read_text() == "mine" and (out / "src" / "main.rs").is_file()


def test_a_stage_writes_into_an_empty_folder_its_own_and_its_own_unfinished_one(tmp_path):
    check_owner(tmp_path / "missing", "train")
    (tmp_path / "empty").mkdir()
    check_owner(tmp_path / "empty", "train")
    check_owner(finished(tmp_path / "draft", "train", "w"), "train")
    check_owner(finished(tmp_path / "target", "target", "w"), "target prepare")
    killed = tmp_path / "killed"  # a train killed before its first manifest
    killed.mkdir()
    (killed / "log.jsonl").write_text("{}\n")
    check_owner(killed, "train")
    with pytest.raises(EaglekitError, match="holds the output of `eaglekit train`"):
        check_owner(tmp_path / "draft", "export")
    (tmp_path / "file").write_text("x")
    with pytest.raises(EaglekitError, match="is a file, not a folder"):
        check_owner(tmp_path / "file", "export")


def test_target_prepare_overwrite_on_a_users_folder_is_refused_before_loading(tiny_target_dir, tmp_path, capsys):
    out = users_folder(tmp_path / "proj" / "target")
    assert main(["target", "prepare", "--target", str(tiny_target_dir), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds files `eaglekit target prepare` did not write (important.txt, src)" in err
    assert "move those files elsewhere" in err
    assert (out / "important.txt").read_text() == "mine" and (out / "src" / "main.rs").is_file()


def test_eaglekit_run_into_a_folder_of_the_users_files_is_refused(tmp_path, capsys):
    """The issue's repro: `eaglekit run --recipe quick --out proj` with the user's proj/target/
    deleted both files, exit 0."""
    proj = tmp_path / "proj"
    users_folder(proj / "target")
    assert main(["run", "--recipe", "quick", "--out", str(proj)]) == 2
    assert "did not write (target)" in capsys.readouterr().err
    assert (proj / "target" / "important.txt").read_text() == "mine"
    assert sorted(p.name for p in proj.iterdir()) == ["target"]


# ---- 2. --overwrite replaces only once the new result is complete --------------------------------


def test_overwrite_in_place_deletes_the_old_result_only_once_the_new_one_is_complete(tmp_path):
    draft = finished(tmp_path / "draft", "train", "old")
    with writer_lock(draft, stage="train"):
        clear_folder(draft)
        assert not any(draft.iterdir())  # readers see no manifest meanwhile
        finished(draft, "train", "new")
    assert (draft / "model.safetensors").read_text() == "new" and hidden_beside(draft) == []


@pytest.mark.parametrize("how", ["fails", "ends unfinished"])
def test_a_failed_overwrite_in_place_puts_the_old_result_back(how, tmp_path):
    draft = finished(tmp_path / "draft", "train", "old")
    before = (draft / MANIFEST).read_text()
    with pytest.raises(RuntimeError) if how == "fails" else contextlib.nullcontext():
        with writer_lock(draft, stage="train"):
            clear_folder(draft)
            (draft / "log.jsonl").write_text("{}\n")  # the new run's first steps
            if how == "fails":
                raise RuntimeError("killed by a bad input")
    assert (draft / "model.safetensors").read_text() == "old" and (draft / MANIFEST).read_text() == before
    assert not (draft / "log.jsonl").exists() and hidden_beside(draft) == []


def test_a_killed_overwrite_in_place_is_put_back_by_the_next_writer(tmp_path):
    """SIGKILL during `train --overwrite` (or generate's): the old result waits beside the folder and
    the next writer puts it back, under the folder's lock, before anything else."""
    draft = finished(tmp_path / "draft", "train", "old")
    aside = tmp_path / f".draft.old-{dead_pid()}"
    draft.rename(aside)
    draft.mkdir()
    (draft / "log.jsonl").write_text("{}\n")  # what the killed run had written
    with writer_lock(draft, stage="train"):
        assert (draft / "model.safetensors").read_text() == "old" and not (draft / "log.jsonl").exists()
    assert missing_outputs(draft) == [] and hidden_beside(draft) == []


def test_an_export_killed_between_its_two_renames_is_rolled_back_by_the_next_run(tmp_path):
    """The issue's case: `export --overwrite` SIGKILLed between its renames left no vllm/, only
    `.vllm.old-PID` and `.vllm.*.tmp`, which no rerun restored or cleaned."""
    pid = dead_pid()
    old = finished(tmp_path / f".vllm.old-{pid}", "export", "old")
    finished(tmp_path / f".vllm.{pid}-abcd1234.tmp", "export", "new")
    finished(tmp_path / ".vllm.k2j4h5g6.tmp", "export", "older")  # named before the pid was in it
    out = tmp_path / "vllm"
    with pytest.raises(EaglekitError, match="already exists"):  # the rerun without --overwrite
        with atomic_dir(out, stage="export"):
            pass
    assert (out / "model.safetensors").read_text() == "old" and not old.exists()
    assert hidden_beside(out) == [] and missing_outputs(out) == []
    with atomic_dir(out, overwrite=True, stage="export") as tmp:  # and a replace completes
        finished(tmp, "export", "new")
    assert (out / "model.safetensors").read_text() == "new" and hidden_beside(out) == []


def test_a_replace_killed_after_its_new_result_was_in_place_keeps_the_new_one(tmp_path):
    out = finished(tmp_path / "vllm", "export", "new")
    finished(tmp_path / f".vllm.old-{dead_pid()}", "export", "old")
    with writer_lock(out, stage="export"):
        pass
    assert (out / "model.safetensors").read_text() == "new" and hidden_beside(out) == []


def test_leftovers_of_a_live_writer_or_another_folder_are_left_alone(tmp_path):
    live = finished(tmp_path / f".vllm.old-{os.getppid()}", "export", "x")  # a running process's
    other = finished(tmp_path / f".vllm.b.{dead_pid()}-abcd1234.tmp", "export", "x")  # folder "vllm.b"'s
    with writer_lock(tmp_path / "vllm", stage="export"):
        pass
    assert live.is_dir() and other.is_dir()


# ---- 4. a finished folder checked against its manifest -------------------------------------------


def test_missing_outputs_names_a_deleted_or_resized_file(tmp_path):
    draft = finished(tmp_path / "draft", "train", "weights")
    (draft / "log.jsonl").write_text("{}\n")  # grows after the manifest: not listed
    assert missing_outputs(draft) == []
    assert json.loads((draft / MANIFEST).read_text())["files"] == {"model.safetensors": 7}
    (draft / "log.jsonl").write_text("{}\n{}\n")
    assert missing_outputs(draft) == []
    (draft / "model.safetensors").write_text("torn")
    assert missing_outputs(draft) == [f"{draft / 'model.safetensors'} has 4 bytes, its manifest says 7"]
    (draft / "model.safetensors").unlink()
    assert missing_outputs(draft) == [f"{draft / 'model.safetensors'} is missing"]
    assert missing_outputs(tmp_path / "export") == [f"{tmp_path / 'export'} is missing"]


def test_eaglekit_run_settles_and_checks_every_stage_folder_before_the_first_stage(tmp_path, capsys):
    """A run refuses a stage folder of the user's before its first stage (not when the bench comes,
    after the data and training), and a killed export's leftovers are settled even where the export
    stage would be skipped."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pipeline.json").write_text(json.dumps({"stages": {}}))
    old = finished(proj / "export" / f".vllm.old-{dead_pid()}", "export", "old")
    users_folder(proj / "bench")
    assert main(["run", "--recipe", "quick", "--out", str(proj)]) == 2
    assert "holds files `eaglekit bench` did not write (important.txt, src)" in capsys.readouterr().err
    assert (proj / "export" / "vllm" / "model.safetensors").read_text() == "old" and not old.exists()
    assert sorted(p.name for p in proj.iterdir()) == ["bench", "export", "pipeline.json"]  # no stage ran
    assert (proj / "bench" / "important.txt").read_text() == "mine"


def test_an_out_that_is_a_file_a_link_loop_or_read_only_is_one_sentence(tmp_path):
    """Issue 41: `--out` a regular file or a symlink loop ended in a FileExistsError traceback."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for out in (tmp_path / "file", tmp_path / "loop"):
        with pytest.raises(EaglekitError, match="is a file .*not a folder"):
            with writer_lock(out, stage="generate"):
                pass
    assert (tmp_path / "file").read_text() == "x"
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        with pytest.raises(EaglekitError, match="cannot make or open the folder"):
            with writer_lock(tmp_path / "ro" / "out", stage="generate"):
                pass
