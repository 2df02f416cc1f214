"""The GPU benchmark script's --smoke mode runs on CPU (tiny models, a few tokens), every part."""

import json
import runpy
import sys
from pathlib import Path

from engine_tiny import one_thread, random_draft  # noqa: F401 (fixture)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_engine.py"


def test_bench_engine_smoke(tmp_path, tiny_target_dir, monkeypatch):
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target

    target = load_target(tiny_target_dir)
    draft = save_draft(random_draft(target.model), tmp_path / "draft")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "x", "turns": ["Hello!", "Count to ten."]}) + "\n")
    out = tmp_path / "out"
    argv = [
        str(SCRIPT),
        "--smoke",
        "--target",
        str(tiny_target_dir),
        "--draft",
        str(draft),
        "--prompts",
        str(prompts),
        "--limit",
        "1",
        "--parts",
        "a,b,c,d,e,p",
        "--out",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    module = runpy.run_path(str(SCRIPT), run_name="bench_engine_smoke")
    assert module["main"](argv[1:]) == 0
    results = json.loads((out / "bench_engine.json").read_text())
    assert not results["errors"] and set("abcde") <= set(results)
    assert results["a"]["engine"]["tokens"] == 12 and results["a"]["greedy_prefix_match_vs_hf"] == 12
    oracle = [v for k, v in results["c"].items() if k.startswith("oracle")]
    # golden: the oracle proposes the engine's own continuation, so every draft is accepted (tau = depth + 1)
    assert len(oracle) == 2 and all(r["match"] and r["tau"] == 4.0 for r in oracle)
    assert all(r["greedy_match"] == 1.0 for r in results["d"].values())
    assert results["e"]["row0_prefix_match_vs_hf"] == 12
    variants = ["reduce+matvec", "sdpa"]  # --kernels default: measured side by side
    assert list(results["a"]["engine_by_kernels"]) == variants and list(results["b"]["engine_by_kernels"]) == variants
    assert all(r["tokens"] == 12 for r in results["a"]["engine_by_kernels"].values())
    assert list(results["p"]) == variants
    assert all(r["kernels_per_step"] > 0 and r["top"] for r in results["p"].values())
    assert "| a SmolLM2 engine" in (out / "bench_engine.md").read_text()


def test_kernel_variants_parse_into_runner_options():
    import pytest

    kernel_options = runpy.run_path(str(SCRIPT), run_name="bench_engine_parse")["kernel_options"]
    assert kernel_options("reduce+matvec") == {"attention": "reduce", "matvec": True}
    assert kernel_options("reduce+matvec@6") == {"attention": "reduce", "matvec": True, "small_rows": 6}
    assert kernel_options("reduce+matvec@1/32") == {
        "attention": "reduce",
        "matvec": True,
        "small_rows": 1,
        "attention_rows": 32,
    }
    for bad in ("reduce+matvec@/32", "reduce@1/x", "flash9", "sdpa+fast"):
        with pytest.raises(SystemExit, match="ATTENTION_ROWS"):
            kernel_options(bad)


def test_bench_cpu_decode_script_runs_on_a_tiny_target(tmp_path, tiny_target_dir):
    """scripts/bench_cpu_decode.py: both step forms and a draft's cycle, timed and written."""
    import subprocess

    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target

    draft = save_draft(random_draft(load_target(tiny_target_dir).model), tmp_path / "draft")
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_cpu_decode.py"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--target",
            str(tiny_target_dir),
            "--batch-sizes",
            "2",
            "--context",
            "8",
            "--cache-slots",
            "128",
            "--steps",
            "1",
            "--draft",
            str(draft),
            "--new-tokens",
            "8",
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    result = json.loads((tmp_path / "bench_cpu_decode.json").read_text())
    row = result["batch"][0]
    assert row["batch"] == 2 and row["full_ms"] > 0 and row["trimmed_ms"] > 0
    assert result["speculation"]["cycle_ms"] > 0 and result["speculation"]["k"] == 3
