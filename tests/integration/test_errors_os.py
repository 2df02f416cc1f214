"""A disk that fills up during `generate` or `features` is one sentence, and both stages resume once space
is freed (a tmpfs in a user and mount namespace; skipped where the kernel allows none)."""

from __future__ import annotations

import json

import pytest

from eaglekit.targets import load_target
from os_faults import EAGLEKIT, in_small_disk, prompts_file
from tiny_conversations import text_rows, write_generate_folder


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
