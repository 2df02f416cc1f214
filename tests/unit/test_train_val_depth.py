"""`--val-ttt-steps`: validation unrolls the draft past its trained steps, so drafts of different
`--ttt-steps` are scored at one served chain length; the trained steps' figures are unchanged."""

from pathlib import Path

import pytest
import torch

from eaglekit.errors import EaglekitError
from eaglekit.train.loop import train
from eaglekit.train.manifest import prediction_text
from train_tiny import (
    config,
    train_data,  # noqa: F401 (fixture `data`)
)

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


def last_validation(manifest):
    return manifest["history"][-1]


def test_validation_deeper_than_training_keeps_the_trained_steps_figures(data, tmp_path):
    settings = dict(ttt_steps=2, max_steps=6, val_every=6)
    own = train(config(data, tmp_path / "own", **settings))
    deep = train(config(data, tmp_path / "deep", val_ttt_steps=4, **settings))
    a, b = last_validation(own), last_validation(deep)
    assert a["step"] == b["step"] == 6
    assert len(a["acc"]) == len(a["walk_accept_length_by_k"]) == 2
    assert len(b["acc"]) == len(b["walk_accept_length_by_k"]) == 4
    # the same training (validation draws nothing from the training's random streams), the same two
    # first steps: a chain of k <= 2 reads only them
    assert b["acc"][:2] == a["acc"][:2]
    assert b["walk_accept_length_by_k"][:2] == a["walk_accept_length_by_k"][:2]
    # the walk that picks the best draft is the deepest one validated
    assert b["walk_accept_length"] == b["walk_accept_length_by_k"][-1]
    at_last = {"config": deep["config"], "best": b}  # training's prediction as the manifest says it
    assert prediction_text(at_last).startswith(
        f"predicted accept length {b['walk_accept_length']:.3f} for a chain of 4"
    )
    by_k = b["walk_accept_length_by_k"]
    assert prediction_text(at_last, 2).startswith(f"predicted accept length {by_k[1]:.3f} for a chain of 2")


def test_validation_shallower_than_training_is_refused(data, tmp_path):
    with pytest.raises(EaglekitError, match="--val-ttt-steps 2"):
        config(data, tmp_path / "run", ttt_steps=3, val_ttt_steps=2)


def test_the_reports_training_section_draws_a_validation_deeper_than_training():
    # training logs its 2 steps, validation 4 (--val-ttt-steps 4): the accuracy chart has every
    # step each logged, the loss sums training's steps on both, the tau is labelled with its chain
    from eaglekit.report.collect import Part, RunData
    from eaglekit.report.html import training_section, weighted_loss

    train_event = {"step": 4, "acc": [0.5, 0.4], "ce": [1.0, 2.0], "sim_accept_length": 1.7}
    val_event = {
        "step": 4,
        "acc": [0.6, 0.5, 0.4, 0.3],
        "ce": [1.0, 2.0, 3.0, 4.0],
        "sim_accept_length": 2.1,
        "walk_accept_length": 1.9,
    }
    training = Part("done", data={"train": [train_event], "val": [val_event], "step_decay": 0.5, "ttt_steps": 2})
    empty = Part("missing")
    html = training_section(RunData(Path("run"), None, "", training, empty, empty, empty))
    assert "val acc_3" in html and "train acc_1" in html and "train acc_2" not in html
    assert "val walk tau (chain 4)" in html
    assert weighted_loss(val_event, 0.5, 2) == weighted_loss(train_event, 0.5, 2) == 2.0
