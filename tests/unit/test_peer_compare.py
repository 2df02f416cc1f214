"""scripts/peer/compare.py: two drafts through the same `eaglekit bench` and doctor probe, one table whose
bench tau is each draft's own (speculating throughout), beside the fallback's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_compare_tables_the_drafts_own_tau(tmp_path, tiny_target_dir):
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    target = load_target(tiny_target_dir)
    drafts = {name: save_draft(random_draft(target.model, aux=[1, 3, 4], seed=seed), tmp_path / name)
              for name, seed in (("a", 0), ("b", 1))}  # fmt: skip
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Write a Python function that adds two numbers."}\n')
    bench = (
        f"--prompts {prompts} --limit 1 --mode chain --k 2 --max-new-tokens 24 --no-hf --device cpu --cache-slots 256"
    )
    out = tmp_path / "compare"
    done = subprocess.run(
        [sys.executable, "scripts/peer/compare.py", "--target", str(tiny_target_dir), "--out", str(out),
         "--bench-args", bench, *(f"{k}={v}" for k, v in drafts.items())],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = (out / "table.md").read_text().splitlines()
    assert "bench tau (speculating throughout)" in rows[0] and len(rows) == 4
    for row, name in zip(rows[2:], drafts):
        s = json.loads((out / name / "bench" / "results.json").read_text())["summary"]
        cells = [c.strip() for c in row.split("|")]
        assert cells[3] == f"**{s['throughout']['tau']:.2f}**" and cells[5] == f"{s['tau']:.2f}"
