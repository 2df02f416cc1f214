"""The generate benchmark's CPU smoke run, a subprocess (the GPU run is the lead's; see scripts/gpu/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_generate.py"


@pytest.mark.slow
def test_bench_generate_smoke(tmp_path, tiny_target_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"b{i}", "source": "bench", "turns": [f"Count from one to {i}."]}) + "\n"
            for i in range(16)
        )
    )
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            "--target",
            str(tiny_target_dir),
            "--prompts",
            str(prompts),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "bench_generate.json").read_text())
    assert report["prompts"]["count"] == 12 and report["prompts"]["same_as_hf"] == 4 and not report["engine_errors"]
    engine, hf = report["engine"]["flex"], report["hf"]
    for r in (engine["all"], engine["same"], hf):
        assert r["batch_size"] == 4 and r["answer_tokens"] > 0 and r["tokens_per_s"] > 0
    assert engine["all"]["prompts"] == 12 and engine["same"]["prompts"] == hf["prompts"] == 4
    # Same greedy tokens from both backends on the same prompts (fp32 on CPU), so the comparison is like for like.
    assert engine["agreement_with_hf"]["identical"] == 1.0 and engine["same_as_eager"]["identical"] == 1.0
    assert engine["same"]["answer_tokens"] == hf["answer_tokens"]
    decoder = engine["all"]["decoder"]
    assert decoder["refills"] == 12 and decoder["answer_tokens"] == engine["all"]["answer_tokens"]
    assert 0 < decoder["occupancy"] <= 1 and decoder["steps"] > 0
    assert engine["speedup_same_over_hf"] > 0 and report["environment"]["command"]
    assert proc.stdout.strip().splitlines()[-1].startswith("engine flex:")
    assert (out / "runs" / "engine-flex-all" / "manifest.json").is_file()
