"""The generate stage resumes after SIGKILL with no prompt lost or answered twice (a subprocess on a tiny target)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eaglekit.cli import main
from engine_tiny import one_thread  # noqa: F401 (fixture)
from generate_folders import make_prompts, read_lines, read_rows


@pytest.mark.slow
def test_resume_after_sigkill_loses_nothing_and_repeats_nothing(tmp_path, tiny_target_dir):
    n = 40
    prompts = make_prompts(tmp_path, n, multi_every=4)
    out = tmp_path / "gen"
    argv = [
        "generate",
        "--prompts",
        str(prompts),
        "--target",
        str(tiny_target_dir),
        "--out",
        str(out),
        "--max-new-tokens",
        "16",
        "--batch-size",
        "1",
        "--shard-size",
        "7",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "eaglekit", *argv]
    for kill_after in (4, 20):  # kill twice, at different points, with SIGKILL (no cleanup runs)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while len(read_lines(out)) < kill_after and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, f"finished before the kill: {proc.stderr.read().decode()[-2000:]}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (out / "manifest.json").exists()
        assert kill_after <= len(read_lines(out)) < n
    assert main(argv) == 0
    rows = read_rows(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == n and set(ids) == {f"p{i}" for i in range(n)}
    # Greedy at batch 1 is deterministic: the resumed folder equals one uninterrupted run.
    clean = tmp_path / "clean"
    assert main(argv[:6] + [str(clean)] + argv[7:]) == 0
    assert sorted(rows, key=lambda r: r["id"]) == sorted(read_rows(clean), key=lambda r: r["id"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["conversations"] == n and manifest["config"]["resumed_from"] >= 20
    assert manifest["config"]["backend"] == "engine"  # the default local backend
    # The engine accounts for its time: decode steps and refills (the prompts' prefills) apart.
    clean_manifest = json.loads((clean / "manifest.json").read_text())
    loop = clean_manifest["decoder"]["serve_loops"][0]
    assert (
        loop["steps"] > 0
        and loop["refills"] == clean_manifest["counts"]["assistant_turns"] > n
        and loop["refill_tokens"] <= loop["refill_padded_tokens"]
    )
    assert (
        loop["decode_s"] > 0 and loop["refill_s"] > 0 and loop["wall_s"] >= loop["decode_s"] + loop["refill_s"] - 1e-3
    )
    assert loop["resumed_tokens"] > 0  # later turns resumed their conversation's row (the same answers, above)
