"""Two `eaglekit bench` processes into one out: the second is refused before it benches."""

import json

import pytest

from eaglekit.cli import main
from engine_tiny import one_thread  # noqa: F401 (fixture)
from tiny_conversations import bench_prompts_file  # noqa: F401 (fixture `prompts_file`)


@pytest.mark.slow  # a second process that loads torch
def test_a_second_bench_into_the_same_out_is_refused_before_it_benches(tmp_path, tiny_target_dir, prompts_file, capsys):
    """Found 2026-12-06 (issue 41): of two `bench --out X` at once, the second was refused only after
    its whole run, its results thrown away. The lock is taken first now: two processes, the second
    refused while the first still benches, which then finishes and writes its results."""
    import os
    import subprocess
    import sys
    import time

    from eaglekit.artifacts import being_written

    out = tmp_path / "b"
    argv = [
        "bench",
        "--target",
        str(tiny_target_dir),
        "--draft",
        "oracle",
        "--prompts",
        str(prompts_file),
        "--max-new-tokens",
        "8",
        "--mode",
        "chain",
        "--k",
        "2",
        "--no-hf",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "eaglekit", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not being_written(out) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert being_written(out), first.communicate()[1][-2000:]
        start = time.monotonic()
        assert main(argv) == 2
        assert "another `eaglekit bench` is writing to" in capsys.readouterr().err
        assert time.monotonic() - start < 10 and first.poll() is None  # refused while the first still ran
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert json.loads((out / "manifest.json").read_text())["stage"] == "bench"
