"""Every refusal of the operating system is a sentence with the fix, not a traceback (issue 41).

An --out no stage can write (a file, a symlink loop, a read-only folder or mount) is refused before
anything loads; a prompts file without read permission, and a disk that fills up during `generate`
or `features` (tests/integration/test_errors_os.py), are one sentence each, and both stages resume
once space is freed. Exit 2 for bad
input, 1 for a failed run. Permissions and mounts are real: the cases that need another user or a
small disk run in a user namespace (`unshare`) and are skipped where the kernel allows none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from eaglekit.cli import main
from os_faults import EAGLEKIT, ENV, in_small_disk, prompts_file, unshare_works


def as_other_user(argv: list[str]) -> subprocess.CompletedProcess:
    """`eaglekit argv` as a user without root's rights over files (root: as `nobody`, through a user
    namespace), so file permissions apply."""
    prefix = []
    if os.geteuid() == 0:
        if not unshare_works("-U"):
            pytest.skip("running as root and no user namespace to drop root's rights in")
        prefix = ["unshare", "-U"]
    return subprocess.run(prefix + EAGLEKIT + argv, capture_output=True, text=True, env=ENV, timeout=120)


def open_folder() -> Path:
    """A folder any user may enter (pytest's are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="eaglekit-os-"))
    folder.chmod(0o777)
    return folder


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


@pytest.mark.parametrize(
    "code, words", [(17, "exists and is not a folder"), (28, "the disk is full"), (13, "permission denied")]
)
def test_safetensors_wrapped_os_errors_are_sentences(code, words):
    """safetensors' own error carries no path (it once raised AttributeError for os error 17)."""
    from safetensors import SafetensorError

    from eaglekit.errors import from_os_error

    err = from_os_error(SafetensorError(f"Error while serializing: I/O error (os error {code})"))
    assert err is not None and words in err.message
