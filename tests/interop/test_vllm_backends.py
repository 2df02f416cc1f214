"""`--backend vllm` for generate and features: the target runs in vLLM's offline engine.

The vLLM tests run eaglekit inside the vLLM venv (scripts/install_vllm_cpu.sh; eaglekit from this
checkout's src through PYTHONPATH), as a user with vLLM and eaglekit in one environment would, on
the real SmolLM2 in float32; the references are computed here with eaglekit's own engine and HF
hooks. Two vLLM starts in all (~1 min each on 2 cores, eager), in one module fixture:

- generate: vLLM resumes a folder the local backend started (same resume rules), answers the rest
  turn by turn (two-turn prompts, a system prompt) through the target's chat template, and its
  greedy answers equal the local backend's;
- features over those conversations: every shard equals the HF hook capture's token for token (ids,
  masks, offsets exactly; aux states within bf16 rounding; the teacher's top-1 everywhere), with the
  same manifest apart from the backend's own keys, and the feature store reads both alike.

Run alone: python -m pytest -m vllm tests/interop/test_vllm_backends.py (~4 min on 2 cores).
The tests that need no vLLM (the recipe's plan, the missing-vLLM error) are in tests/unit/test_vllm_backends.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.cli import main
from tiny_conversations import CHAT_PROMPTS as PROMPTS

VENV = Path(os.environ.get("EAGLEKIT_VLLM_VENV", Path.home() / ".cache/eaglekit/vllm-venv"))
SRC = Path(__file__).resolve().parents[2] / "src"
COMMON = ["--max-new-tokens", "32", "--dtype", "float32", "--context-length", "1024"]


def needs_vllm(test):
    for mark in (
        pytest.mark.vllm,
        pytest.mark.slow,
        pytest.mark.skipif(
            not (VENV / "bin/python").exists(), reason=f"no vLLM venv at {VENV} (scripts/install_vllm_cpu.sh)"
        ),
    ):
        test = mark(test)
    return test


def eaglekit_in_vllm_venv(argv: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "VLLM_TARGET_DEVICE": "cpu", "VLLM_DISABLE_COMPILE_CACHE": "1"}
    with open(log, "wb") as out:
        proc = subprocess.run(
            [str(VENV / "bin/python"), "-m", "eaglekit", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1200,
        )
    if proc.returncode != 0:
        raise AssertionError(
            f"eaglekit {' '.join(argv[:2])} in the vLLM venv exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        )


def rows(folder: Path) -> dict[str, dict]:
    found = [json.loads(x) for p in sorted(folder.glob("conversations-*.jsonl")) for x in p.read_text().splitlines()]
    assert len(found) == len({r["id"] for r in found})
    return {r["id"]: r for r in found}


@pytest.fixture(scope="module")
def runs(smollm2_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm-backends")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    gen = ["generate", "--prompts", str(prompts), "--target", str(smollm2_dir), *COMMON]
    assert main([*gen, "--out", str(root / "local"), "--backend", "local"]) == 0
    # vLLM resumes a folder the local backend started: one answered conversation kept, no manifest yet.
    shutil.copytree(root / "local", root / "vllm")
    (root / "vllm" / "manifest.json").unlink()
    shard = next((root / "vllm").glob("conversations-*.jsonl"))
    kept = shard.read_text().splitlines()[0]
    shard.write_text(kept + "\n")
    eaglekit_in_vllm_venv(
        [*gen, "--out", str(root / "vllm"), "--backend", "vllm", "--enforce-eager", "--gpu-memory-utilization", "0.3"],
        root / "generate.log",
    )
    feat = [
        "features",
        "--target",
        str(smollm2_dir),
        "--data",
        str(root / "vllm"),
        "--dtype",
        "float32",
        "--shard-tokens",
        "160",
        "--no-progress",
    ]
    # 48 tokens a forward: each conversation is prefilled in chunks, forwards mix requests, a shard takes several.
    eaglekit_in_vllm_venv(
        [
            *feat,
            "--out",
            str(root / "fv"),
            "--backend",
            "vllm",
            "--batch-tokens",
            "48",
            "--gpu-memory-utilization",
            "0.3",
        ],
        root / "features.log",
    )
    assert main([*feat, "--out", str(root / "fh"), "--backend", "hf", "--device", "cpu"]) == 0
    return {"root": root, "kept": json.loads(kept)["id"], "target": smollm2_dir}


@needs_vllm
def test_generate_through_vllm_resumes_and_equals_local(runs):
    root = runs["root"]
    local, served = rows(root / "local"), rows(root / "vllm")
    assert sorted(served) == sorted(local) == ["a", "b", "c", "d", "e"]
    manifest = json.loads((root / "vllm" / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "vllm" and manifest["config"]["resumed_from"] == 1
    assert manifest["counts"]["assistant_turns"] == 7
    assert manifest["target"] == json.loads((root / "local" / "manifest.json").read_text())["target"]
    assert served["c"]["messages"][0] == {"role": "system", "content": "Answer in one line."}
    answered = [k for k in served if k != runs["kept"]]
    for k in answered:  # turn by turn: each user turn follows the target's own answer
        assert [m["role"] for m in served[k]["messages"] if m["role"] != "system"] == ["user", "assistant"] * len(
            PROMPTS[ord(k) - ord("a")]["turns"]
        )
    same = [k for k in answered if served[k]["messages"] == local[k]["messages"]]
    print(f"\nvLLM greedy answers equal to the local backend's (fp32): {len(same)} of {len(answered)}")
    assert len(same) >= len(answered) - 1, {
        k: (served[k]["messages"], local[k]["messages"]) for k in answered if k not in same
    }


@needs_vllm
def test_features_through_vllm_equal_hf_capture(runs):
    root = runs["root"]
    index_v = json.loads((root / "fv" / "index.json").read_text())
    index_h = json.loads((root / "fh" / "index.json").read_text())
    assert [(e["file"], e["ids"], e["lengths"]) for e in index_v["shards"]] == [
        (e["file"], e["ids"], e["lengths"]) for e in index_h["shards"]
    ]
    assert len(index_v["shards"]) > 1
    worst_abs, worst_rel, top1, topk_same, logp, differ, elements = 0.0, 0.0, [], [], 0.0, 0, 0
    for entry in index_h["shards"]:
        v, h = load_file(str(root / "fv" / entry["file"])), load_file(str(root / "fh" / entry["file"]))
        assert v.keys() == h.keys()
        for key in ("input_ids", "loss_mask", "offsets"):
            assert torch.equal(v[key], h[key]), key
        assert v["aux"].dtype == h["aux"].dtype == torch.bfloat16 and v["aux"].shape == h["aux"].shape
        a, b = v["aux"].float(), h["aux"].float()
        diff = (a - b).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        differ, elements = differ + int((diff > 0).sum()), elements + diff.numel()
        # bf16 keeps 8 significant bits: two roundings of nearly equal fp32 values differ by <= 1 ulp.
        worst_rel = max(worst_rel, float((diff / b.abs().clamp(min=1e-2)).max()))
        torch.testing.assert_close(a, b, rtol=2**-7, atol=2e-2)
        top1.append(torch.equal(v["topk_ids"][:, 0], h["topk_ids"][:, 0]))
        topk_same.append(float((v["topk_ids"] == h["topk_ids"]).float().mean()))
        logp = max(logp, float((v["topk_logp"].float() - h["topk_logp"].float()).abs().max()))
    print(
        f"\nvLLM vs HF aux states (fp32 targets, stored bf16): {differ} of {elements} values differ, max abs diff "
        f"{worst_abs:.4g}, max rel diff {worst_rel:.4g}; teacher top-1 equal in every shard: {all(top1)}; top-k ids equal "
        f"{min(topk_same):.4f} (worst shard); max |logp diff| {logp:.4g}"
    )
    assert all(top1) and min(topk_same) > 0.95 and logp < 0.05
    mv, mh = (json.loads((root / f / "manifest.json").read_text()) for f in ("fv", "fh"))
    assert mv["target"] == mh["target"] and mv["inputs"] == mh["inputs"] and mv["complete"] and mh["complete"]
    assert {k: c for k, c in mv["counts"].items() if k != "teacher_topk_mass"} == {
        k: c for k, c in mh["counts"].items() if k != "teacher_topk_mass"
    }
    own = {"backend": "vllm", "tensor_parallel_size": 1, "dtype": "float32"}
    assert mv["config"] == {**mh["config"], **own}
    from eaglekit.features.store import FeatureStore

    stores = [FeatureStore(root / f, target_fingerprint=mh["target"]) for f in ("fv", "fh")]
    assert stores[0].manifest["config"]["aux_layer_ids"] == stores[1].manifest["config"]["aux_layer_ids"]
