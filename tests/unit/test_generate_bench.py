"""The generate benchmark's CPU smoke mode (the GPU run is the lead's; see scripts/gpu/)."""

from __future__ import annotations

import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_generate.py"


def test_bench_generate_reads_jsonl_with_unicode_line_separators(tmp_path):
    """A 4096-prompt H200 run failed reading back an answer holding U+2028 (str.splitlines splits there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_generate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from eaglekit.artifacts import write_manifest

    rows = [
        {"id": "a", "messages": [{"role": "assistant", "content": "one\u2028two\x85three\x1cfour"}]},
        {"id": "b", "messages": [{"role": "assistant", "content": "plain"}]},
    ]
    path = tmp_path / "conversations-00000.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    write_manifest(tmp_path, stage="generate", config={}, target=None, counts={"conversations": 2})
    assert module.read_rows(tmp_path) == rows
