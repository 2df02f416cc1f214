"""The bench and `speculate` with the engine's plain fallback (issue 42): a cycle's cost leaves the
fallback's plain steps out, the results say how many tokens were plain, the sweep's shapes take the
run's setting, `--draft random` / `oracle` speculate throughout, `speculate` prints the counts."""

import json

import pytest

from eaglekit.bench.report import markdown, summarize, turn_records, verdict
from eaglekit.bench.run import Turn
from eaglekit.cli import main
from eaglekit.engine.generate import Generation
from engine_tiny import one_thread  # noqa: F401 (fixture)

LABEL = "chain k=1"


def fallback_turn():
    """100 tokens: plain decoding 0.2 s a token; speculation 10 cycles of 2 tokens at 0.5 s each and
    80 tokens by plain steps (0.2 s each) in 2 fallbacks."""
    out = list(range(100))
    spec = Generation(
        out, "length", 10 * 0.5 + 80 * 0.2, accept_lengths=[1] * 10, plain_tokens=80, fallbacks=2, cycle_cost=2.4
    )
    return Turn(prompt_id="a", turn=0, ids=[1, 2, 3], plain=Generation(out, "length", 20.0), spec={LABEL: spec})


def test_a_cycles_cost_leaves_the_fallbacks_plain_steps_out_and_the_summary_counts_them():
    turns = [fallback_turn()]
    result = summarize(turns, LABEL, 1, greedy=True)
    s = result["summary"]
    # 21 s over 10 cycles would say a cycle costs 10.5 plain steps; the cycles took 5 s of it: 2.5 steps
    assert s["cycle"]["plain_steps"] == pytest.approx(2.5, abs=1e-3)
    assert s["cycle"]["cycle_ms"] == pytest.approx(500, abs=0.01) and s["cycle"]["fallback_ms"] == pytest.approx(16000)
    assert s["cycle"]["engine_plain_steps"] == 2.4  # the engine's own figure, beside it
    assert (s["plain_fallback"], s["plain_tokens"], s["plain_share"], s["fallbacks"]) == (True, 80, 0.8, 2)
    assert result["prompts"][0]["plain_tokens"] == 80
    rec = turn_records(turns)[0]["spec"][LABEL]
    assert (rec["plain_tokens"], rec["fallbacks"], rec["cycle_cost"]) == (80, 2, 2.4)
    assert "2.50 plain steps" in verdict(
        s
    ) and "80% of the speculative runs' tokens were decoded by plain steps" in verdict(s)
    result["summary"].update(device="cpu", date="d", verdict=verdict(s), timing={}, config={"dtype": "torch.float32"})
    result["config"] = {"target": "t", "draft": "d", "sampling": "greedy", "max_new_tokens": 100}
    text = markdown(result)
    line = "Plain fallback: 80 of 100 tokens of the speculative runs (80%) were decoded by plain steps, in 2 fallbacks"
    assert line in text and text.index(line) < text.index("Per-position acceptance")
    # without the fallback: the cycle's cost as before, and the report says every token came from cycles
    off = Turn(
        prompt_id="a",
        turn=0,
        ids=[1],
        plain=Generation(list(range(20)), "length", 4.0),
        spec={LABEL: Generation(list(range(20)), "length", 5.0, accept_lengths=[1] * 10)},
    )
    s = summarize([off], LABEL, 1, greedy=True)["summary"]
    assert s["cycle"]["plain_steps"] == pytest.approx(2.5) and (s["plain_fallback"], s["plain_tokens"]) == (False, 0)
    assert "plain fallback" not in verdict(s)


def bench(tmp_path, target, prompts, draft, *extra):
    out = tmp_path / "bench"
    assert (
        main(
            [
                "bench",
                "--target",
                str(target),
                "--draft",
                draft,
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "24",
                "--no-hf",
                "--limit",
                "1",
                "--out",
                str(out),
                "--overwrite",
                *extra,
            ]
        )
        == 0
    )
    return json.loads((out / "results.json").read_text()), (out / "report.md").read_text()


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Write a Python function that adds two numbers."}) + "\n")
    return path


@pytest.mark.parametrize("draft", ["random", "oracle"])
def test_a_random_or_oracle_draft_speculates_throughout(tmp_path, tiny_target_dir, prompts_file, draft):
    """A random draft measures the draft's cost, the oracle the engine at full acceptance: with the
    fallback most of a random draft's tokens would be plain steps."""
    result, text = bench(tmp_path, tiny_target_dir, prompts_file, draft, "--mode", "chain", "--k", "2")
    assert result["summary"]["config"]["plain_fallback"] is False
    spec = result["turns"][0]["spec"]["chain k=2"]
    assert (spec["plain_tokens"], spec["fallbacks"], spec["cycle_cost"]) == (0, 0, None)
    if draft == "random":
        assert len(spec["accept_lengths"]) >= 8  # every token from a cycle
    assert "Plain fallback off" in text


def test_the_sweep_takes_the_runs_plain_fallback(tmp_path, tiny_target_dir, prompts_file, monkeypatch):
    """A weak (random-weight) draft folder: every swept shape falls back, as the single shape does."""
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.engine.generate import Engine
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    # A cycle's cost as given, not timed: on a tiny CPU model a cycle costs about a plain step, and a
    # loaded machine's timings let some shape's cycles look as if they paid (this test failed so)
    monkeypatch.setattr(Engine, "_cost", lambda self: 3.0)
    target = load_target(tiny_target_dir)
    folder = save_draft(random_draft(target.model, aux=[1, 3, 4]), tmp_path / "draft")
    result, text = bench(tmp_path, tiny_target_dir, prompts_file, str(folder), "--sweep", "--cache-slots", "256")
    labels = [r["spec"] for r in result["sweep"]]
    spec = result["turns"][0]["spec"]
    assert set(spec) == set(labels) and all(spec[label]["cycle_cost"] is not None for label in labels)
    assert all(r["plain_tokens"] > 0 and r["plain_fallback"] for r in result["sweep"])
    s = result["summary"]
    assert s["plain_tokens"] == spec[s["spec"]]["plain_tokens"] > 0 and s["config"]["plain_fallback"] is True
    assert "Plain fallback: " in text and "| plain-step tokens |" in text


def test_speculate_prints_the_fallbacks_counts(tmp_path, tiny_target_dir, capsys):
    args = [
        "speculate",
        "Write a Python function that adds two numbers.",
        "--draft",
        "random",
        "--target",
        str(tiny_target_dir),
        "--max-new-tokens",
        "24",
        "--device",
        "cpu",
        "--mode",
        "chain",
        "--k",
        "2",
        "--no-plain",
    ]
    assert main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "plain_tokens " in last and "fallbacks " in last
    assert main([*args, "--no-plain-fallback"]) == 0
    assert "plain_tokens" not in capsys.readouterr().out


def test_each_prompt_and_category_says_how_much_was_decoded_plainly():
    b = Turn(
        prompt_id="b",
        turn=0,
        ids=[1],
        plain=Generation(list(range(20)), "length", 4.0),
        spec={LABEL: Generation(list(range(20)), "length", 5.0, accept_lengths=[1] * 10)},
    )
    result = summarize([fallback_turn(), b], LABEL, 1, greedy=True, categories={"a": "weak", "b": "strong"})
    s = result["summary"]
    assert [r["plain_share"] for r in result["prompts"]] == [0.8, 0.0] and s["plain_share"] == pytest.approx(
        80 / 120, abs=1e-4
    )
    assert (s["by_category"]["weak"]["plain_share"], s["by_category"]["strong"]["plain_share"]) == (0.8, 0.0)
    s.update(device="cpu", date="d", verdict="v", timing={}, config={})
    result["config"] = {"target": "t", "draft": "d", "sampling": "greedy", "max_new_tokens": 100}
    rows = [
        line
        for line in markdown(result).splitlines()
        if line.startswith(("| a |", "| b |", "| **all** |", "| weak |", "| strong |"))
    ]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["80%", "0%", "67%", "80%", "0%"]


def test_the_chosen_shape_also_runs_speculating_throughout(tmp_path, tiny_target_dir, prompts_file):
    """With the fallback on, the same engine runs the same turns again without it: the draft's own tau
    (the fallback's tau counts only the cycles it let run), in the summary, the verdict and the report."""
    from eaglekit.draft.checkpoint import save_draft
    from eaglekit.targets import load_target
    from engine_tiny import random_draft

    target = load_target(tiny_target_dir)
    folder = save_draft(random_draft(target.model, aux=[1, 3, 4]), tmp_path / "draft")
    shape = ["--mode", "chain", "--k", "2", "--cache-slots", "256"]
    result, text = bench(tmp_path, tiny_target_dir, prompts_file, str(folder), *shape)
    spec, s = result["turns"][0]["spec"], result["summary"]
    assert set(spec) == {"chain k=2", "chain k=2 throughout"}
    assert spec["chain k=2"]["plain_tokens"] > 0  # a random-weight draft: the fallback takes over
    pure = spec["chain k=2 throughout"]
    assert (pure["plain_tokens"], pure["fallbacks"], pure["cycle_cost"]) == (0, 0, None)
    accepts = pure["accept_lengths"]
    assert len(accepts) >= 8 and s["throughout"]["tau"] == pytest.approx(1 + sum(accepts) / len(accepts), abs=1e-3)
    assert s["tau"] == pytest.approx(result["prompts"][0]["tau"])  # the headline's tau is the fallback run's
    assert "Speculating throughout (no plain fallback" in text and "the draft's own tau is" in s["verdict"]
    assert "so the tau above reads high" in text  # the fallback's run had plain tokens
    assert (
        json.loads((tmp_path / "bench" / "manifest.json").read_text())["summary"]["throughout"]["tau"]
        == (s["throughout"]["tau"])
    )
    # speculating throughout already: one run, nothing to add
    result, text = bench(tmp_path, tiny_target_dir, prompts_file, str(folder), *shape, "--no-plain-fallback")
    assert set(result["turns"][0]["spec"]) == {"chain k=2"} and "throughout" not in result["summary"]
    assert "Speculating throughout" not in text
