"""The generate benchmark's CPU smoke mode (the GPU run is the lead's; see scripts/gpu/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "bench_generate.py"


@pytest.mark.slow
def test_bench_generate_smoke(tmp_path, tiny_target_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"b{i}", "source": "bench", "turns": [f"Count from one to {i}."]}) + "\n"
                               for i in range(12)))
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--target", str(tiny_target_dir), "--prompts",
                           str(prompts), "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "bench_generate.json").read_text())
    assert set(report["results"]) == {"engine", "hf"} and report["prompts"]["count"] == 8
    for r in report["results"].values():
        assert r["prompts"] == 8 and r["batch_size"] == 4 and r["answer_tokens"] > 0 and r["tokens_per_s"] > 0
    # Same greedy tokens from both backends (fp32 on CPU), so the comparison is like for like.
    assert report["identical_answers"] == 1.0
    assert report["results"]["engine"]["answer_tokens"] == report["results"]["hf"]["answer_tokens"]
    assert report["speedup_engine_over_hf"] > 0 and report["environment"]["command"]
    assert proc.stdout.strip().splitlines()[-1].startswith("engine / hf tokens/s:")
    assert (out / "runs" / "engine" / "manifest.json").is_file()
