"""Every refusal of the operating system is a sentence with the fix, not a traceback (issue 41).

An --out no stage can write (a file, a symlink loop, a read-only folder or mount) is refused before
anything loads; a prompts file without read permission, and a disk that fills up during `generate`
or `features`, are one sentence each, and both stages resume once space is freed. Exit 2 for bad
input, 1 for a failed run. Permissions and mounts are real: the cases that need another user or a
small disk run in a user namespace (`unshare`) and are skipped where the kernel allows none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_features import text_rows

from eaglekit.cli import main
from eaglekit.targets import load_target
from tiny_conversations import write_generate_folder

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]),
}
EAGLEKIT = [sys.executable, "-m", "eaglekit"]


def unshare_works(*flags: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0


def as_other_user(argv: list[str]) -> subprocess.CompletedProcess:
    """`eaglekit argv` as a user without root's rights over files (root: as `nobody`, through a user
    namespace), so file permissions apply."""
    prefix = []
    if os.geteuid() == 0:
        if not unshare_works("-U"):
            pytest.skip("running as root and no user namespace to drop root's rights in")
        prefix = ["unshare", "-U"]
    return subprocess.run(prefix + EAGLEKIT + argv, capture_output=True, text=True, env=ENV, timeout=120)


def in_small_disk(script: str, mount: Path) -> None:
    """Run a shell script with a tmpfs mounted at `mount` (a mount namespace of its own)."""
    if not unshare_works("-rm"):
        pytest.skip("no user and mount namespace to mount a small disk in")
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["unshare", "-rm", "sh", "-c", script], check=True, env=ENV, timeout=240)


def open_folder() -> Path:
    """A folder any user may enter (pytest's are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="eaglekit-os-"))
    folder.chmod(0o777)
    return folder


def prompts_file(folder: Path, n: int = 3) -> Path:
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "turns": [f"Say {i} things."]}) + "\n" for i in range(n)))
    path.chmod(0o644)
    return path


# ---- --out that no stage can write ----------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "features", "train", "export"])
def test_an_out_that_is_a_file_is_refused(tmp_path, capsys, command):
    """Before: FileExistsError (a traceback)."""
    out = tmp_path / "out"
    out.write_text("the user's notes\n")
    argv = {
        "generate": ["generate", "--prompts", str(prompts_file(tmp_path)), "--target", "smollm2"],
        "features": ["features", "--data", str(tmp_path), "--target", "smollm2"],
        "train": ["train", "--features", str(tmp_path), "--target", "smollm2"],
        "export": ["export", str(tmp_path), "--format", "vllm"],
    }[command]
    assert main([*argv, "--out", str(out)]) == 2
    assert f"--out {out} is a file, not a folder" in capsys.readouterr().err
    assert out.read_text() == "the user's notes\n"


def test_an_out_that_is_a_symlink_loop_or_lies_in_a_file_is_refused(tmp_path, capsys):
    prompts = str(prompts_file(tmp_path))
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["generate", "--prompts", prompts, "--target", "smollm2", "--out", str(loop)]) == 2
    assert f"--out {loop} is a symlink loop" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert (
        main(["generate", "--prompts", prompts, "--target", "smollm2", "--out", str(tmp_path / "notes.txt/out")]) == 2
    )
    assert "lies inside a file, not a folder" in capsys.readouterr().err


def test_an_out_in_a_read_only_folder_is_refused_before_the_target_loads(tmp_path):
    """Before: `generate` loaded the model, then PermissionError. The target here does not exist, so
    any check made after loading it would say so instead."""
    folder = open_folder()
    try:
        prompts = prompts_file(folder)
        locked = folder / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        run = as_other_user(
            [
                "generate",
                "--prompts",
                str(prompts),
                "--target",
                str(tmp_path / "no-such-target"),
                "--out",
                str(locked / "conv"),
            ]
        )
        assert run.returncode == 2, run.stderr
        assert f"--out {locked / 'conv'} cannot be written: {locked} is read-only for this user" in run.stderr
        assert "Traceback" not in run.stderr and not (locked / "conv").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_out_on_a_read_only_mount_is_refused(tmp_path):
    mount = tmp_path / "ro"
    prompts = prompts_file(tmp_path)
    in_small_disk(
        f"mount -t tmpfs -o ro tmpfs {mount} && {' '.join(EAGLEKIT)} generate --prompts {prompts} "
        f"--target smollm2 --out {mount}/conv 2> {tmp_path}/err; echo $? > {tmp_path}/rc",
        mount,
    )
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert f"{mount} is a read-only file system" in err and "Traceback" not in err


# ---- inputs without read permission ---------------------------------------------------------------


def test_a_prompts_file_without_read_permission_is_one_sentence():
    """Before: PermissionError (a traceback)."""
    folder = open_folder()
    try:
        prompts = prompts_file(folder)
        prompts.chmod(0o000)
        run = as_other_user(["generate", "--prompts", str(prompts), "--target", "smollm2", "--out", str(folder / "c")])
        assert run.returncode == 2, run.stderr
        assert f"permission denied: {prompts}" in run.stderr and "Traceback" not in run.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- the disk fills up, then space is freed -------------------------------------------------------


@pytest.mark.slow
def test_features_on_a_full_disk_say_so_and_resume_once_space_is_freed(tiny_target_dir, tmp_path):
    """Before: `SafetensorError ... os error 28` (a traceback). ~600 bytes a token: 24 conversations
    fill four shards of 200 tokens, more than 64 KiB; the rerun with room finishes the same store."""
    target = load_target(str(tiny_target_dir))
    conv = write_generate_folder(tmp_path / "conv", text_rows(24), target.fingerprint())
    mount = tmp_path / "disk"
    cmd = (
        f"{' '.join(EAGLEKIT)} features --target {tiny_target_dir} --data {conv} --out {mount}/feat --device cpu "
        f"--aux-layer-ids 1,3,4 --teacher-topk 8 --shard-tokens 200 --no-progress"
    )
    in_small_disk(
        f"mount -t tmpfs -o size=64k tmpfs {mount}; {cmd} 2> {tmp_path}/err1; echo $? > {tmp_path}/rc1; "
        f"ls -A {mount}/feat > {tmp_path}/left; mount -o remount,size=8m {mount}; "
        f"{cmd} 2> {tmp_path}/err2; echo $? > {tmp_path}/rc2; cp {mount}/feat/manifest.json {tmp_path}/m.json",
        mount,
    )
    err = (tmp_path / "err1").read_text()
    assert (tmp_path / "rc1").read_text().strip() == "1", err
    assert "error: the disk is full: shard" in err and "finished shards are kept" in err
    assert "resumes at this shard" in err and "Traceback" not in err
    assert not [n for n in (tmp_path / "left").read_text().split() if n.endswith(".tmp")]  # no torn shard left
    assert (tmp_path / "rc2").read_text().strip() == "0", (tmp_path / "err2").read_text()
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["complete"] is True and manifest["counts"]["samples"] == 24


@pytest.mark.slow
def test_generate_on_a_full_disk_says_so_and_resumes_once_space_is_freed(tiny_target_dir, tmp_path):
    """Before: `OSError: [Errno 28]` (a traceback), a torn last line in the shard."""
    prompts = prompts_file(tmp_path, n=40)
    mount = tmp_path / "disk"
    cmd = (
        f"{' '.join(EAGLEKIT)} generate --prompts {prompts} --target {tiny_target_dir} --out {mount}/conv "
        f"--backend hf --device cpu --max-new-tokens 8 --batch-size 4 --shard-size 1000"
    )
    in_small_disk(
        f"mount -t tmpfs -o size=16k tmpfs {mount}; {cmd} 2> {tmp_path}/err1; echo $? > {tmp_path}/rc1; "
        f"mount -o remount,size=8m {mount}; {cmd} 2> {tmp_path}/err2; echo $? > {tmp_path}/rc2; "
        f"cp {mount}/conv/manifest.json {tmp_path}/m.json",
        mount,
    )
    err = (tmp_path / "err1").read_text()
    assert (tmp_path / "rc1").read_text().strip() == "1", err
    assert "error: the disk is full" in err and "run the same command again" in err and "Traceback" not in err
    assert (tmp_path / "rc2").read_text().strip() == "0", (tmp_path / "err2").read_text()
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["counts"]["conversations"] + manifest["counts"]["skipped"] == 40


@pytest.mark.parametrize(
    "code, words", [(17, "exists and is not a folder"), (28, "the disk is full"), (13, "permission denied")]
)
def test_safetensors_wrapped_os_errors_are_sentences(code, words):
    """safetensors' own error carries no path (it once raised AttributeError for os error 17)."""
    from safetensors import SafetensorError

    from eaglekit.errors import from_os_error

    err = from_os_error(SafetensorError(f"Error while serializing: I/O error (os error {code})"))
    assert err is not None and words in err.message
