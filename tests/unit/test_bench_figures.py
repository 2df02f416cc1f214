"""The bench's figures from hand-built per-prompt records, golden values: the headline speedup is each
method's total tokens over its total time, the per-prompt median and spread beside it, per category;
the drift warning reaches the markdown and the HTML report. No model runs here."""

import json

import pytest

from eaglekit.bench.report import markdown, summarize, verdict
from eaglekit.bench.run import Turn, bracket
from eaglekit.engine.generate import Generation

LABEL = "chain k=1"


def turn(pid, tokens, plain_s, spec_s, accepts, hf_s=None, k=0):
    """One turn: `tokens` new tokens by every method; speculation in cycles of 1 + accepts[i] tokens."""
    out = list(range(tokens))
    assert sum(a + 1 for a in accepts) == tokens
    return Turn(
        prompt_id=pid,
        turn=k,
        ids=[1, 2, 3],
        plain=Generation(out, "length", plain_s),
        hf=Generation(out, "length", hf_s) if hf_s else None,
        spec={LABEL: Generation(out, "length", spec_s, accept_lengths=accepts)},
    )


def issue_turns():
    """The shape of the quick recipe's bench (issue 42): one short prompt that runs fast plainly and
    slowly speculated, beside long prompts where speculation pays."""
    return [
        turn("short", 10, 0.4, 1.0, [0] * 10, hf_s=2.0),  # plain 25 tok/s, spec 10 tok/s
        turn("long1", 100, 20.0, 14.0, [1] * 50),  # plain 5 tok/s, spec 7.14 tok/s
        turn("long2", 100, 20.0, 14.0, [1] * 50),
    ]


def test_the_headline_is_total_tokens_over_total_time_with_the_per_prompt_spread_beside_it():
    result = summarize(issue_turns(), LABEL, 1, greedy=True)
    s = result["summary"]
    # A mean of per-prompt rates gave (10 + 7.14 + 7.14) / (25 + 5 + 5) = 0.694x here: the short prompt's
    # 25 tok/s outweighed 200 tokens. Totals: plain 210 tokens in 40.4 s, speculation 210 in 29 s.
    assert s["baseline_tok_s"] == pytest.approx(210 / 40.4, abs=0.01)
    assert s["spec_tok_s"] == pytest.approx(210 / 29, abs=0.01)
    assert s["speedup"] == pytest.approx((210 / 29) / (210 / 40.4), abs=1e-3) == pytest.approx(1.393, abs=1e-3)
    assert [r["speedup"] for r in result["prompts"]] == [0.4, 1.428, 1.428]
    assert s["per_prompt_speedup"] == {
        "median": 1.428,
        "q1": 0.914,
        "q3": 1.428,
        "min": 0.4,
        "max": 1.428,
        "min_id": "short",
        "max_id": "long1",
    }
    # The cycle's cost and tau now predict the headline: tokens per cycle = tau, so speedup = tau / plain steps.
    assert s["tau"] == pytest.approx(1 + 100 / 110, abs=1e-3)
    assert s["cycle"]["plain_steps"] == pytest.approx((29 / 110) / (40.4 / 210), abs=1e-3)
    assert s["speedup"] == pytest.approx(s["tau"] / s["cycle"]["plain_steps"], abs=2e-3)
    assert "1.39x faster" in verdict(s)
    # HF generate ran on the short prompt alone: every ratio on that prompt's totals
    assert (s["hf_prompts"], s["hf_tok_s"], s["speedup_vs_hf"], s["baseline_vs_hf"]) == (1, 5.0, 2.0, 5.0)
    assert s["by_category"] is None  # no categories given


def test_multi_turn_prompts_add_their_turns_and_categories_get_their_own_figures():
    turns = [
        turn("a", 20, 2.0, 1.0, [1] * 10),
        turn("a", 20, 6.0, 5.0, [1] * 10, k=1),  # 40 tokens: 8 s / 6 s
        turn("b", 30, 3.0, 6.0, [0] * 30),
        turn("c", 10, 1.0, 1.0, [0] * 10),
    ]
    categories = {"a": "writing", "b": "writing", "c": "math"}
    result = summarize(turns, LABEL, 1, greedy=True, categories=categories)
    rows = {r["id"]: r for r in result["prompts"]}
    assert rows["a"]["plain"] == {"tokens": 40, "seconds": 8.0, "tok_s": 5.0}
    assert rows["a"]["speedup"] == pytest.approx((40 / 6) / 5, abs=1e-3)
    cats = result["summary"]["by_category"]
    assert list(cats) == ["writing", "math"]
    w = cats["writing"]
    assert (w["prompts"], w["cycles"], w["plain_tok_s"], w["spec_tok_s"]) == (2, 50, 6.36, 5.83)  # 70 / 11, 70 / 12
    assert w["speedup"] == pytest.approx(11 / 12, abs=1e-3)  # totals: not the mean of 1.334 and 0.5
    assert w["tau"] == pytest.approx(1 + 20 / 50, abs=1e-3)  # weighted by cycles
    assert w["per_prompt_speedup"]["median"] == pytest.approx((1.334 + 0.5) / 2, abs=1e-3)
    assert cats["math"]["speedup"] == 1.0 and cats["math"]["per_prompt_speedup"]["min_id"] == "c"
    text = markdown(with_header(result))
    assert "| writing | 2 | 1.40 | 6.4 | 5.8 | 0.92x | 0.92x (0.50-1.33x) | 0% |" in text
    assert "Per prompt: median 1.00x, middle half 0.75-1.17x, range 0.50x (b) to 1.33x (a)." in text
    # one category only (a file without categories, or all one kind): no table of one row
    assert (
        summarize(turns, LABEL, 1, greedy=True, categories={"a": "x", "b": "x", "c": "x"})["summary"]["by_category"]
        is None
    )


def with_header(result, timing=None):
    result["summary"].update(
        device="cpu", date="d", verdict="v", timing=timing or {}, config={"dtype": "torch.float32"}
    )
    result["config"] = {"target": "t", "draft": "d", "sampling": "greedy", "max_new_tokens": 8}
    return result


def test_the_drift_warning_heads_the_markdown_and_the_json_summary():
    turns = issue_turns()
    again = [Generation(list(range(len(t.plain.tokens))), "length", 2 * t.plain.seconds) for t in turns]
    timing = bracket(turns, again)  # plain ran at half speed after speculation
    assert timing["drift"] == 1.0 and "differ by 100%" in timing["warning"]
    result = with_header(summarize(turns, LABEL, 1, greedy=True), timing)
    text = markdown(result)
    assert text.index(f"**Warning**: {timing['warning']}.") < text.index("| prompt |")
    assert json.loads(json.dumps(result))["summary"]["timing"]["warning"] == timing["warning"]
    quiet = bracket(
        issue_turns(), [Generation(list(range(len(t.plain.tokens))), "length", t.plain.seconds) for t in issue_turns()]
    )
    assert "warning" not in quiet and "Warning" not in markdown(with_header(summarize(turns, LABEL, 1, True), quiet))


def test_the_html_report_shows_the_drift_warning_and_the_spread(tmp_path):
    from eaglekit.report.collect import collect
    from eaglekit.report.html import render

    turns = issue_turns()
    timing = {"drift": 0.5, "warning": "a turn's two plain runs differ by 50%"}
    result = with_header(summarize(turns, LABEL, 1, greedy=True), timing)
    result["summary"]["per_position_acceptance"] = [0.9]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "results.json").write_text(json.dumps(result))
    html = render(collect(tmp_path))
    assert 'data-warning="drift"' in html and "differ by 50%" in html
    assert "median 1.43x, middle half 0.914-1.43x, range 0.4x (short) to 1.43x (long1)" in html
    result["summary"]["timing"] = {"drift": 0.01}
    (tmp_path / "bench" / "results.json").write_text(json.dumps(result))
    assert "data-warning" not in render(collect(tmp_path))
