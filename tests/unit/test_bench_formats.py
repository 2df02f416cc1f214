"""`eaglekit bench` and `speculate` on drafts of every format the doctor reads: our own exports
(SGLang, speculators, EAGLE) and a SpecForge-style folder with no eaglekit block, converted in
memory through the import path; each gives the same answer and acceptance as the native draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from eaglekit.artifacts import write_manifest
from eaglekit.cli import main
from eaglekit.draft.checkpoint import save_draft
from eaglekit.formats import export_draft
from eaglekit.targets import load_target
from engine_tiny import one_thread, random_draft  # noqa: F401 (fixture)

SPECULATE = ["--mode", "chain", "--k", "3", "--max-new-tokens", "24", "--no-graphs", "--no-compile"]


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> dict[str, Path]:
    """The repeat oracle (accepted only when read right: its fc reads one aux layer through a
    permutation) as a native draft, its SGLang and vLLM exports, and a SpecForge-style copy."""
    from oracle_draft import oracle_exports, save_repeat_target

    root = tmp_path_factory.mktemp("oracle")
    folders = oracle_exports(save_repeat_target(root / "target"), root)
    folders["target"] = root / "target"
    folders["specforge"] = specforge_copy(folders["sglang"], root / "specforge")
    return folders


@pytest.fixture(scope="module")
def eagle_export(tiny_target_dir, tmp_path_factory) -> dict[str, Path]:
    """EAGLE captures only the default aux layers: a draft on those, native and exported for EAGLE and SGLang."""
    root = tmp_path_factory.mktemp("eagle")
    target = load_target(tiny_target_dir)
    native = save_draft(random_draft(target.model, aux=[1, 3, 4], draft_vocab=200), root / "native")
    write_manifest(native, stage="train", config={}, target=target.fingerprint(), extra={"complete": True})
    for fmt in ("eagle", "sglang"):
        export_draft(native, fmt, root / fmt, target=str(tiny_target_dir))
    return {"eagle": root / "eagle", "sglang": root / "sglang"}


def specforge_copy(sglang: Path, out: Path) -> Path:
    """The SGLang export as another trainer writes it: no eaglekit block, no manifest, `layers.0.` names."""
    out.mkdir()
    config = json.loads((sglang / "config.json").read_text())
    config.pop("eaglekit")
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(sglang / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def speculate(capsys, target: Path, draft: Path) -> tuple[str, float]:
    assert (
        main(["speculate", "Count from one to ten.", "--target", str(target), "--draft", str(draft), *SPECULATE]) == 0
    )
    out = capsys.readouterr().out.strip()
    text, stats, plain = out.rsplit("\n", 2)
    # The plain run of the same prompt, beside it (greedy fp32: the same tokens).
    assert plain.startswith("[plain decoding: ") and "x (same tokens;" in plain, plain
    return text, float(stats.split("tau ")[1].split(",")[0])


@pytest.mark.parametrize("fmt", ["vllm", "specforge"])
def test_speculate_reads_foreign_formats_as_their_producer_meant(fmt, oracle, capsys):
    # The exports hold bf16 weights: they are compared with the SGLang export, not the fp32 native draft.
    reference = speculate(capsys, oracle["target"], oracle["sglang"])
    assert reference[1] > 1.15, reference  # the oracle is accepted (1.28); misread aux layers give 1.00
    assert speculate(capsys, oracle["target"], oracle[fmt]) == reference


def test_speculate_reads_an_eagle_export(eagle_export, tiny_target_dir, capsys):
    assert speculate(capsys, tiny_target_dir, eagle_export["eagle"]) == speculate(
        capsys, tiny_target_dir, eagle_export["sglang"]
    )


def test_bench_on_an_export_says_which_format_it_read(oracle, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "turns": ["Count from one to ten."]}) + "\n")
    out = tmp_path / "bench"
    assert (
        main(
            [
                "bench",
                "--target",
                str(oracle["target"]),
                "--draft",
                str(oracle["vllm"]),
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "24",
                "--mode",
                "chain",
                "--k",
                "3",
                "--no-hf",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["draft_format"] == "speculators (vLLM's native format)" and summary["greedy_match"] == 1.0
    # golden (the seeded oracle export, chain k=3): accept length and acceptance per position, speculating
    # throughout (the fallback's run stops speculating where the timed cycles do not pay: a machine's speed)
    assert summary["throughout"]["tau"] == pytest.approx(1.278, rel=1e-4)
    assert summary["throughout"]["per_position_acceptance"] == pytest.approx([0.1667, 0.0556, 0.0556], rel=1e-4)
    assert json.loads((out / "manifest.json").read_text())["inputs"]["draft"]["format"] == summary["draft_format"]
    timing = summary["timing"]
    assert timing["plain_tok_s_before"] > 0 and timing["plain_tok_s_after"] > 0 and timing["drift"] >= 0


def test_a_machine_that_changes_speed_mid_bench_is_said(tiny_target_dir):
    """A turn's plain run after its speculative ones brackets them with the one before; a wide gap is a warning."""
    from dataclasses import replace

    from eaglekit.bench.run import Turn, bracket
    from eaglekit.engine import Engine
    from eaglekit.runtime import Sampling, make_target_runner
    from eaglekit.targets.chat import prompt_ids

    target = load_target(tiny_target_dir)
    runner = make_target_runner(target.model, max_len=128, aux_layer_ids=[], runner="auto")
    engine = Engine(runner, sampling=Sampling(), stop_token_ids=target.stop_token_ids, graphs=False, compile=False)
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": "Count from one to ten."}])
    plain = engine.generate(ids, 16, speculative=False, seed=0)
    slow = replace(plain, seconds=plain.seconds * 4)  # the first run went while the machine was loaded
    turns = [Turn("a", 0, ids, plain=slow), Turn("b", 0, ids, plain=slow)]
    timing = bracket(turns, [plain, plain])
    assert timing["drift"] > 1 and "not trustworthy" in timing["warning"]
    assert plain.seconds < turns[0].plain.seconds < slow.seconds  # the baseline: the mean of both runs
    steady = [Turn("a", 0, ids, plain=plain)]
    assert bracket(steady, [plain])["drift"] == 0 and "warning" not in bracket(steady, [plain])


def test_a_bad_draft_path_fails_before_the_target_loads(tmp_path, capsys):
    missing_target = str(tmp_path / "no-target")  # would be the error if the target were looked at first
    for argv in (
        ["speculate", "hi", "--draft", str(tmp_path / "nowhere"), "--target", missing_target],
        ["bench", "--draft", str(tmp_path / "nowhere"), "--target", missing_target, "--out", str(tmp_path / "b")],
    ):
        assert main(argv) == 2
        assert "no draft folder" in capsys.readouterr().err


def test_a_draft_without_a_recorded_target_must_fit_the_target(tiny_target_dir, tmp_path, capsys):
    from tiny import tiny_model

    other = tiny_model("llama", vocab_size=500)  # another tokenizer's vocab, and no manifest to say so
    folder = save_draft(random_draft(other, aux=[1, 3, 4]), tmp_path / "draft")
    assert main(["speculate", "hi", "--draft", str(folder), "--target", str(tiny_target_dir), *SPECULATE]) == 2
    assert "has vocab_size 500, the target 384" in capsys.readouterr().err
