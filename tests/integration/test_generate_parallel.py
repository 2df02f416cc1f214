"""`eaglekit generate --devices` resumes after SIGKILL with nothing lost or repeated (CPU workers on a tiny target)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglekit.cli import main
from generate_folders import by_id, generate_argv, make_prompts, read_lines, read_rows


def _locked(folder: Path) -> bool:
    """Whether a writer still holds `folder` (the generate lock)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _worker_lines(out: Path) -> int:
    return sum(len(read_lines(w)) for w in (out / "workers").glob("[0-9]*"))


@pytest.mark.slow
def test_resume_after_sigkill_loses_nothing_and_repeats_nothing(tmp_path, tiny_target_dir, capsys):
    n = 40
    prompts = make_prompts(tmp_path, n, multi_every=4)
    out = tmp_path / "gen"
    flags = ["--max-new-tokens", "16", "--batch-size", "1", "--shard-size", "7"]
    argv = generate_argv(prompts, tiny_target_dir, out, *flags, "--devices", "cpu,cpu")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # First the parent alone is killed (its workers notice and die), then the whole process group.
    for kill_after, whole_group in ((4, False), (16, True)):
        proc = subprocess.Popen(
            [sys.executable, "-m", "eaglekit", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.time() + 120
        while (
            (not (out / "workers").is_dir() or _worker_lines(out) < kill_after)
            and proc.poll() is None
            and time.time() < deadline
        ):
            time.sleep(0.01)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read().decode()[-2000:]}"
        if whole_group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 30
        while any(_locked(w) for w in (out / "workers").glob("[0-9]*")) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(_locked(w) for w in (out / "workers").glob("[0-9]*")), "a worker outlived its parent"
        assert not (out / "manifest.json").exists()
        assert kill_after <= _worker_lines(out) < n
    # An unfinished folder of 2 workers: another number of devices, or one process, is refused.
    assert main(argv[:-1] + ["cpu,cpu,cpu"]) == 2
    err = capsys.readouterr().err
    assert "made by 2 workers" in err and "this run is 3 workers" in err and "as many --devices as before" in err
    assert main(argv[:-2]) == 2
    assert "this run is one process" in capsys.readouterr().err
    assert main(argv) == 0
    rows = read_rows(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == n and set(ids) == {f"p{i}" for i in range(n)}
    # Greedy at batch 1 is deterministic: the resumed folder equals one uninterrupted process.
    clean = tmp_path / "clean"
    assert main(generate_argv(prompts, tiny_target_dir, clean, *flags)) == 0
    assert by_id(rows) == by_id(read_rows(clean))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["conversations"] == n and manifest["config"]["resumed_from"] >= 16 - 2  # a torn line each
    assert all(len(w["devices"]) == 3 for w in manifest["counts"]["workers"])
