"""What training's prediction is for: the served chain's length and the validation workload
(train/manifest.py), and the recipes' validation defaults (chat-like held-out prompts)."""

from __future__ import annotations

from eaglekit.train.manifest import predicted_accept_length, prediction_text, validation_label


def manifest(by_k, label="held-out conversations: sharegpt 40, oasst 12"):
    return {
        "config": {"ttt_steps": len(by_k)},
        "best": {"walk_accept_length": by_k[-1], "walk_accept_length_by_k": by_k},
        "counts": {"validation": {"label": label}},
    }


def test_the_prediction_is_the_walk_at_the_served_chain_length_and_names_its_workload():
    m = manifest([1.5, 1.8, 1.95, 2.03, 2.08, 2.1, 2.12])
    assert predicted_accept_length(m, 5) == 2.08 and predicted_accept_length(m) == 2.12
    assert prediction_text(m, 5) == (
        "predicted accept length 2.080 for a chain of 5 on held-out conversations: sharegpt 40, oasst 12"
    )
    # A bench of a longer chain than the run unrolled (or a tree): the run's own walk, said so.
    assert prediction_text(m, 9).startswith("predicted accept length 2.120 for a chain of 7 on")
    assert prediction_text(m, None).startswith("predicted accept length 2.120 for a chain of 7 on")
    # A manifest from before the workload was recorded still reads.
    old = {"config": {"ttt_steps": 3}, "best": {"walk_accept_length": 1.9}, "counts": {}}
    assert validation_label(old) == "held-out conversations"
    assert prediction_text(old, 2) == "predicted accept length 1.900 for a chain of 3 on held-out conversations"


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_gpu_recipe_validates_on_held_out_chat_prompts_not_on_the_mix(tmp_path):
    """smollm2-h200: the prompt files all train; validation is the Magpie prompts' held-out share (the
    target's own chat questions) with no hash share of the training mix beside it, unless the user
    names the workload (`FILE,validation-fraction=F` or `validation.source`)."""
    from eaglekit.pipeline.recipe import apply_override, load_recipe
    from eaglekit.pipeline.run import planned

    recipe = load_recipe("smollm2-h200")
    apply_override(recipe, "prompts.source=[a.jsonl, b.jsonl]")
    stages = {s.name: s.argv for s in planned(recipe, tmp_path)}
    assert float(flag(stages["prompts"], "--validation-fraction")) == 0
    held_out = float(flag(stages["synthesize"], "--validation-fraction")) * recipe["synthesize"]["add"]
    assert 256 <= held_out <= recipe["train"]["val-max-samples"]
    assert float(flag(stages["train"], "--val-fraction")) == 0 and "--val-data" not in stages["train"]
    # `validation.source` stays an option: the workload's own prompts, answered, become the validation set.
    apply_override(recipe, "validation.source=mt_bench.jsonl")
    stages = {s.name: s.argv for s in planned(recipe, tmp_path)}
    assert flag(stages["train"], "--val-data") == str(tmp_path / "val-conversations")
