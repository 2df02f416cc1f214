"""SmolLM2 writing its own prompts: sampled, deduplicated, topping up a small prompt set."""

from __future__ import annotations

import json

import pytest

from eaglekit.cli import main
from eaglekit.data.prompts import build_prompts
from eaglekit.data.readers import SourceSpec
from engine_tiny import one_thread  # noqa: F401 (fixture)


def synth(smollm2_dir, out, *extra: str) -> int:
    return main(
        [
            "prompts",
            "synthesize",
            "--target",
            str(smollm2_dir),
            "--out",
            str(out),
            "--batch-size",
            "8",
            "--max-new-tokens",
            "48",
            "--validation-fraction",
            "0.25",
            *extra,
        ]
    )


def rows(folder) -> dict[str, list[dict]]:
    return {
        s: [json.loads(x) for x in (folder / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "validation")
    }


@pytest.mark.slow
def test_smollm2_writes_its_own_prompts(tmp_path, smollm2_dir):
    out = tmp_path / "synth"
    assert synth(smollm2_dir, out, "--num-prompts", "5", "--temperature", "1.0", "--seed", "1") == 0
    found = rows(out)
    prompts = found["train"] + found["validation"]
    assert len(prompts) == 5 and len({p["turns"][0].lower() for p in prompts}) == 5
    assert all(p["source"] == "magpie" and len(p["turns"][0]) >= 10 and "<|im_" not in p["turns"][0] for p in prompts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "prompts" and manifest["synthesized_by"]["architecture"] == "LlamaForCausalLM"
    assert manifest["config"]["pre_query_template"].endswith("<|im_start|>user\n")
    assert manifest["config"]["end_of_turn"] == "<|im_end|>"
    assert manifest["counts"]["synthesis"]["synthesized"] == 5

    # Greedy sampling writes the same question every time: deduplication keeps one, and the
    # shortfall is reported (exit status 1), not hidden.
    greedy = tmp_path / "greedy"
    assert synth(smollm2_dir, greedy, "--num-prompts", "3", "--temperature", "0", "--max-attempts", "8") == 1
    counts = json.loads((greedy / "manifest.json").read_text())["counts"]["synthesis"]
    assert counts["synthesized"] == 1 and counts["duplicates"] + counts["unfinished"] + counts["too_short"] == 7

    # Topping up: the existing prompts stay (in their splits) and new ones fill up to the count.
    src = tmp_path / "few.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"s{i}", "turns": [f"Seed question number {i}?"]}) + "\n" for i in range(3))
    )
    build_prompts([SourceSpec.parse(str(src))], tmp_path / "few", validation_fraction=0.25)
    before = rows(tmp_path / "few")
    topped = tmp_path / "topped"
    assert synth(smollm2_dir, topped, "--num-prompts", "6", "--top-up", str(tmp_path / "few"), "--seed", "2") == 0
    after = rows(topped)
    for split in ("train", "validation"):
        assert after[split][: len(before[split])] == before[split]
    new = [p for s in after.values() for p in s if p["source"] == "magpie"]
    assert len(new) == 3 and len(after["train"]) + len(after["validation"]) == 6
    assert (
        main(
            [
                "prompts",
                "synthesize",
                "--target",
                str(smollm2_dir),
                "--out",
                str(tmp_path / "x"),
                "--num-prompts",
                "2",
                "--top-up",
                str(tmp_path / "few"),
            ]
        )
        == 2
    )
