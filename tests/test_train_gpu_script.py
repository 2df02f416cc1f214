"""scripts/gpu/train_draft.py in its CPU smoke mode: every mode runs and writes what the lead collects."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglekit.draft.checkpoint import load_draft

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_draft_script_smoke(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(REPO / "scripts" / "gpu" / "train_draft.py"), "--smoke", "--mode", "bench,ddp,full",
           "--out", str(out), "--work", str(tmp_path / "work"), "--part-mib", "0.05"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads((out / "train_draft.json").read_text())
    assert result["capture"]["bytes_per_token"] > 0
    bench = result["bench"]
    for kind in ("offline", "online"):
        assert bench[kind]["tokens_per_s"] > 0 and len(bench[kind]["val_final"]["acc"]) == 3
    assert result["ddp"]["gpus_2"]["tokens_per_s"] > 0 and result["ddp"]["speedup"] > 0
    # The exported draft is split into parts; reassembled, it loads and matches its checksum.
    draft_dir = out / "draft"
    parts = sorted(draft_dir.glob("model.safetensors.part-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    assert len(parts) > 1 and not (draft_dir / "model.safetensors").exists()
    (draft_dir / "model.safetensors").write_bytes(b"".join(p.read_bytes() for p in parts))
    for p in parts:
        p.unlink()
    import hashlib

    assert hashlib.sha256((draft_dir / "model.safetensors").read_bytes()).hexdigest() == result["full"]["export"]["sha256"]
    assert load_draft(draft_dir).config.draft_vocab_size == result["full"]["draft_vocab"]["draft_vocab_size"]
    assert json.loads((draft_dir / "manifest.json").read_text())["stage"] == "train"
