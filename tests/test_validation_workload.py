"""What training's prediction is for: the served chain's length and the validation workload
(train/manifest.py), and the recipes' validation defaults (chat-like held-out prompts)."""

from __future__ import annotations

from pathlib import Path

import yaml

from eaglekit.train.manifest import predicted_accept_length, prediction_text, validation_label

RECIPES = Path(__file__).resolve().parents[1] / "src" / "eaglekit" / "pipeline" / "recipes"


def manifest(by_k, label="held-out conversations: sharegpt 40, oasst 12"):
    return {"config": {"ttt_steps": len(by_k)},
            "best": {"walk_accept_length": by_k[-1], "walk_accept_length_by_k": by_k},
            "counts": {"validation": {"label": label}}}


def test_the_prediction_is_the_walk_at_the_served_chain_length_and_names_its_workload():
    m = manifest([1.5, 1.8, 1.95, 2.03, 2.08, 2.1, 2.12])
    assert predicted_accept_length(m, 5) == 2.08 and predicted_accept_length(m) == 2.12
    assert prediction_text(m, 5) == ("predicted accept length 2.080 for a chain of 5 on held-out conversations: "
                                     "sharegpt 40, oasst 12")
    # A bench of a longer chain than the run unrolled (or a tree): the run's own walk, said so.
    assert prediction_text(m, 9).startswith("predicted accept length 2.120 for a chain of 7 on")
    assert prediction_text(m, None).startswith("predicted accept length 2.120 for a chain of 7 on")
    # A manifest from before the workload was recorded still reads.
    old = {"config": {"ttt_steps": 3}, "best": {"walk_accept_length": 1.9}, "counts": {}}
    assert validation_label(old) == "held-out conversations"
    assert prediction_text(old, 2) == "predicted accept length 1.900 for a chain of 3 on held-out conversations"
