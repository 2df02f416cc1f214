"""The data-scaling recipe section and train's --train-fraction share (the real run is in test_report.py)."""

import json

import pytest
import yaml

from eaglekit.cli import main
from eaglekit.errors import EaglekitError
from eaglekit.features.conversations import is_validation
from eaglekit.pipeline.recipe import load_recipe
from eaglekit.pipeline.scaling import (
    ScalingPlan,
    main_is_full_slice,
    reuses_main,
    scaling_plan,
    slice_row,
    train_acc0,
    verdict,
)
from eaglekit.report.scaling import acc0_chart, tau_chart
from eaglekit.train.config import TrainConfig
from eaglekit.train.setup import in_train_share, train_share


def test_train_shares_are_nested_stable_and_independent_of_validation():
    ids = [f"conv-{i}" for i in range(4000)]
    shares = {f: {i for i in ids if in_train_share(i, f)} for f in (0.125, 0.25, 0.5, 1.0)}
    assert shares[0.125] <= shares[0.25] <= shares[0.5] <= shares[1.0] == set(ids)
    for f, members in shares.items():
        assert abs(len(members) / len(ids) - f) < 0.03, f
    # the same ids in another order (or among more data) land in the same shares
    assert {i for i in reversed(ids + ["new-1", "new-2"]) if in_train_share(i, 0.25)} - {"new-1", "new-2"} == shares[
        0.25
    ]
    # a salted hash: the share is not the validation split's low end
    val = {i for i in ids if is_validation(i, 0.25)}
    assert abs(len(val & shares[0.25]) / len(val) - 0.25) < 0.05
    with pytest.raises(EaglekitError, match="keeps none"):
        train_share(["a"], [0], 1e-9)
    with pytest.raises(EaglekitError, match="train_fraction"):
        TrainConfig(target="t", out="o", features="f", train_fraction=0)


def recipe_with(tmp_path, **scaling_and_train):
    train = scaling_and_train.pop("train", {"epochs": 1})
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"target": "smollm2", "train": train, **scaling_and_train}))
    return load_recipe(str(path))


def test_scaling_section_is_checked(tmp_path):
    assert scaling_plan(recipe_with(tmp_path)) is None
    plan = scaling_plan(recipe_with(tmp_path, scaling={"fractions": [0.125, 0.25, 0.5, 1], "steps": 50}))
    assert plan == ScalingPlan((0.125, 0.25, 0.5, 1.0), 50, True)
    bad = [
        ({"fractions": [0.5]}, "at least two"),
        ({"fractions": [0.5, 0.25]}, "increase"),
        ({"fractions": [0.5, 1.5]}, "increase within"),
        ({"fractions": [0, 1]}, "increase within"),
        ({"fractions": [0.5, 1], "steps": 0}, "steps"),
        ({"fractions": [0.5, 1], "every": 2}, "unknown keys"),
        ({"fractions": [0.5, 1], "bench": "yes"}, "bench"),
        ([0.5, 1], "must be a section"),
    ]
    for section, message in bad:
        with pytest.raises(EaglekitError, match=message):
            scaling_plan(recipe_with(tmp_path, scaling=section))
    with pytest.raises(EaglekitError, match="init-from"):
        scaling_plan(recipe_with(tmp_path, scaling={"fractions": [0.5, 1]}, train={"init-from": "d"}))
    # override syntax, as on the command line
    recipe = load_recipe("quick", ["scaling.fractions=[0.25, 0.5, 1.0]", "scaling.steps=30"])
    assert scaling_plan(recipe) == ScalingPlan((0.25, 0.5, 1.0), 30, True)


def test_a_bad_scaling_section_stops_the_run_before_any_stage(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--recipe", "quick", "--out", str(out), "scaling.fractions=[1.0, 0.5]"]) == 2
    assert "scaling.fractions must increase" in capsys.readouterr().err
    assert not (out / "pipeline.json").exists()


def test_verdict_reads_the_two_largest_slices():
    rows = [
        {"fraction": f, "status": "done", "walk_tau": t, "steps": 10} for f, t in ((0.25, 1.5), (0.5, 1.7), (1.0, 1.9))
    ]
    assert "still rising" in verdict(rows) and "+0.200" in verdict(rows)
    rows[-1]["walk_tau"] = 1.72
    assert "flat within 0.05" in verdict(rows) and "limited by its steps" not in verdict(rows)
    assert verdict(rows[:1]) is None


def test_a_flat_curve_whose_smallest_share_was_repeated_says_the_steps_bind():
    """The H200 curve of 2026-12-03: at 500 steps the 1/8 share, seen up to 3.8 times, did as well as all
    the data. That is a step budget too small to ask the question, and the verdict must say so."""
    rows = [
        {"fraction": f, "status": "done", "walk_tau": t, "steps": 500, "passes": p}
        for f, t, p in ((0.125, 1.760, 3.8), (0.25, 1.741, 1.9), (0.5, 1.747, 0.95), (1.0, 1.750, None))
    ]
    said = verdict(rows)
    assert "limited by its steps" in said and "0.125 share" in said and "3.8 times" in said
    rows[0]["passes"] = None  # a manifest from before `per_epoch`: the plain reading
    assert "limited by its steps" not in verdict(rows) and "flat within 0.05" in verdict(rows)


def test_the_full_share_is_the_main_draft_only_when_it_is_the_same_run(tmp_path):
    """A main draft of N steps planned as N (max-steps, no time budget) on all the data is the
    share-1.0 slice: the curve reads it instead of training it again. Anything else is trained."""
    same = {
        "complete": True,
        "steps": {"done": 40, "total": 40},
        "config": {"train_fraction": 1.0, "max_steps": 40, "time_budget_s": None},
    }
    assert main_is_full_slice(same, 40)
    assert not main_is_full_slice(same, 30)  # another budget
    assert not main_is_full_slice({**same, "complete": False}, 40)  # unfinished
    budgeted = {**same, "config": {**same["config"], "time_budget_s": 60.0}}  # re-planned schedule
    assert not main_is_full_slice(budgeted, 40)
    by_epochs = {**same, "config": {**same["config"], "max_steps": None}}
    assert not main_is_full_slice(by_epochs, 40)
    out = tmp_path / "run"
    (out / "draft").mkdir(parents=True)
    (out / "draft" / "manifest.json").write_text(
        json.dumps(
            {**same, "best": {"step": 40, "walk_accept_length": 1.8, "acc": [0.5]}, "counts": {"train_samples": 9}}
        )
    )
    state = {"stages": {"train": {"status": "done", "argv": ["train", "--max-steps", "40"]}}}
    assert reuses_main(out, 1.0, 40) and not reuses_main(out, 0.5, 40)
    row = slice_row(out, 1.0, 40, state)
    assert row["main_draft"] and row["status"] == "done" and row["walk_tau"] == 1.8 and row["samples"] == 9
    assert row["command"] == "eaglekit train --max-steps 40"
    assert slice_row(out, 0.5, 40, state)["status"] == "not run"  # its own slice, not run yet


def test_a_plan_before_the_main_draft_prints_every_stage_and_says_what_is_not_known(tmp_path, capsys):
    """`eaglekit run --plan` with a scaling section: the slices' steps are the main draft's, unknown
    before it runs, so the plan lists every other stage and says so (scaling.steps plans them too)."""
    out, args = tmp_path / "run", ["run", "--recipe", "quick", "--plan", "scaling.fractions=[0.5, 1.0]"]
    assert main([*args, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(" train " in line for line in lines) and any(" bench " in line for line in lines)
    assert lines[-1].startswith("# then the scaling slices: the scaling slices run the main draft's steps")
    assert "set scaling.steps" in lines[-1] and not out.exists()
    assert main([*args, "scaling.steps=30", "--out", str(out)]) == 0
    planned = capsys.readouterr().out
    assert "--train-fraction 0.5 --max-steps 30" in planned and "--train-fraction 1 --max-steps 30" in planned


def test_a_flat_curve_is_drawn_flat():
    """The 2026-12-03 curve (step-0 accuracy 0.471-0.477) drawn on its own range showed noise as a
    dip. Accuracy is drawn on 0..1 and tau from 1 up, with room above the top point."""
    import re

    rows = [
        {"fraction": f, "status": "done", "tokens": n, "walk_tau": t, "sim_tau": t + 0.3, "acc0": a}
        for f, n, t, a in ((0.125, 1.46e6, 1.760, 0.477), (0.25, 2.89e6, 1.741, 0.471), (1.0, 11.6e6, 1.750, 0.474))
    ]
    table = {"steps": 500, "rows": rows}
    ticks = lambda svg: [float(v) for v in re.findall(r'text-anchor="end">([0-9.]+)</text>', svg)]  # noqa: E731
    assert min(ticks(acc0_chart(table))) == 0 and max(ticks(acc0_chart(table))) == 1
    tau_ticks = ticks(tau_chart(table))
    assert min(tau_ticks) == 1 and max(tau_ticks) > 2.06  # above the top point (2.06)
    assert tau_chart({"steps": 500, "rows": [{"fraction": 1.0, "status": "not run"}]}) is None


def test_the_verdict_names_a_small_share_that_overfits(tmp_path):
    """The H200 curve of 2026-12-03 at 2,000 steps: the 1/8 share, seen 11.5 times, scored ~0.68 on its
    training batches and 0.629 held out; all of the data ~0.60 and 0.649. The verdict says which overfits."""
    log = tmp_path / "log.jsonl"
    lines = [json.dumps({"event": "train", "step": s, "acc": [a, 0.5]}) for s, a in ((10, 0.2), (20, 0.7), (30, 0.66))]
    log.write_text("\n".join([*lines, json.dumps({"event": "val", "step": 30, "acc": [0.1]}), '{"event": "tra']))
    assert train_acc0(log, last=2) == 0.68  # the val event and the half-written last line left out
    assert train_acc0(tmp_path / "missing.jsonl") is None
    log.write_text("\n".join([lines[0], "not json", lines[1]]))
    with pytest.raises(EaglekitError, match="line 2 is not JSON"):  # only a torn LAST line is left out
        train_acc0(log)
    rows = [
        {
            "fraction": 0.125,
            "status": "done",
            "walk_tau": 2.303,
            "steps": 2000,
            "passes": 11.5,
            "acc0": 0.629,
            "train_acc0": 0.68,
        },
        {"fraction": 1.0, "status": "done", "walk_tau": 2.356, "steps": 2000, "acc0": 0.649, "train_acc0": 0.60},
    ]
    said = verdict(rows)
    assert "still rising" in said and "the 0.125 share overfits (training step-0 accuracy 0.680 against 0.629" in said
    rows[0]["train_acc0"] = 0.62
    assert "overfits" not in verdict(rows)
