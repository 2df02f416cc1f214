"""Benchmark figures: per prompt and overall, as JSON, a markdown table and a PNG plot.

tok/s and speedup: each method's total tokens over its total time on the same prompts, with the
per-prompt speedups' median and spread beside it, overall and per prompt category (`bench/stats.py`).
tau = tokens committed per target forward in the speculation cycles, bonus included; per-position
acceptance[i] = P(the first i+1 drafts of a cycle were all accepted) (chain: per draft position;
tree: per depth of the accepted path).
Plain fallback (`SpecConfig.plain_fallback`): a speculative run may decode some tokens by plain steps
(where its cycles did not pay); tok/s and the speedup include them, tau and a cycle's cost count the
cycles only, and the summary says how many tokens were plain (`plain_tokens`, `plain_share`).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

from eaglekit.artifacts import atomic_path
from eaglekit.bench.run import Turn
from eaglekit.bench.stats import by_category, group_stats, plain_share, rate, total_rate
from eaglekit.errors import EaglekitError
from eaglekit.metrics import accept_length, acceptance_by_position

log = logging.getLogger(__name__)


def method_stats(gens) -> dict:
    tokens = sum(len(g.tokens) for g in gens)
    seconds = sum(g.seconds for g in gens)
    return {"tokens": tokens, "seconds": round(seconds, 4), "tok_s": round(rate(tokens, seconds), 2)}


def summarize(
    turns: list[Turn], label: str, max_depth: int, greedy: bool, categories: dict[str, str] | None = None
) -> dict:
    """Per-prompt rows and the overall `summary` for one speculation setting; `categories`: prompt
    id -> category, for the figures per category."""
    by_prompt: dict[str, list[Turn]] = {}
    for turn in turns:
        by_prompt.setdefault(turn.prompt_id, []).append(turn)
    rows = []
    for pid, group in by_prompt.items():
        specs = [t.spec[label] for t in group]
        accepts = [a for g in specs for a in g.accept_lengths]
        row = {
            "id": pid,
            "turns": len(group),
            "plain": method_stats([t.plain for t in group]),
            "spec": method_stats(specs),
            "tau": round(accept_length(accepts), 3),
            "cycles": len(accepts),
            "plain_tokens": sum(g.plain_tokens for g in specs),
        }
        row["plain_share"] = plain_share([row])
        if group[0].hf is not None:
            row["hf"] = method_stats([t.hf for t in group])
        row["speedup"] = round(rate(row["spec"]["tok_s"], row["plain"]["tok_s"]), 3)
        row["greedy_match"] = all(t.spec[label].tokens == t.plain.tokens for t in group) if greedy else None
        rows.append(row)
    accepts = [a for t in turns for a in t.spec[label].accept_lengths]
    if not accepts:  # tau and a cycle's cost would be invented (tau 1.00 of no cycle)
        raise EaglekitError(
            f"{label}: no speculative cycle ran in {len(turns)} turns (every answer ended at the "
            "prefill's first token)",
            hint="ask for more tokens (--max-new-tokens 2 or more)",
        )
    overall = group_stats(rows)  # the total-time rates and speedup, as every category's
    summary = {
        "spec": label,
        "tau": round(accept_length(accepts), 3),
        "baseline_tok_s": overall["plain_tok_s"],
        "spec_tok_s": overall["spec_tok_s"],
        "per_position_acceptance": [round(x, 4) for x in acceptance_by_position(accepts, max_depth)],
        "cycles": len(accepts),
        "turns": len(turns),
        "prompts": len(rows),
        "new_tokens": {
            "plain": sum(r["plain"]["tokens"] for r in rows),
            "spec": sum(r["spec"]["tokens"] for r in rows),
        },
    }
    summary["speedup"] = overall["speedup"]
    summary["speedup_basis"] = "total tokens / total seconds of each method on the same prompts"
    summary["per_prompt_speedup"] = overall["per_prompt_speedup"]
    summary["by_category"] = by_category(rows, categories)
    summary.update(hf_summary(rows))
    summary["efficiency"] = round(summary["speedup"] / summary["tau"], 3)  # 1.0 = speedup equals tau
    summary["cycle"] = cycle_cost(turns, label)
    summary.update(fallback_summary([t.spec[label] for t in turns]), plain_share=overall["plain_share"])
    if greedy:
        summary["greedy_match"] = round(sum(t.spec[label].tokens == t.plain.tokens for t in turns) / len(turns), 4)
        with_hf = [t for t in turns if t.hf is not None]
        if with_hf:
            summary["hf_match"] = round(sum(t.hf.tokens == t.plain.tokens for t in with_hf) / len(with_hf), 4)
    else:
        summary["greedy_match"] = None
    return {"summary": summary, "prompts": rows}


def hf_summary(rows: list[dict]) -> dict:
    """HF generate against the engine on the prompts HF ran (the first `--hf-prompts`): each ratio
    compares the methods on the same prompts."""
    rows = [r for r in rows if "hf" in r]
    if not rows:
        return {"hf_tok_s": None, "hf_prompts": 0, "speedup_vs_hf": None, "baseline_vs_hf": None}
    hf = total_rate(rows, "hf")
    return {
        "hf_tok_s": round(hf, 2),
        "hf_prompts": len(rows),
        "speedup_vs_hf": round(rate(total_rate(rows, "spec"), hf), 3) if hf else None,
        "baseline_vs_hf": round(rate(total_rate(rows, "plain"), hf), 3) if hf else None,
    }


def cycle_cost(turns: list[Turn], label: str) -> dict:
    """What one speculative cycle costs in plain decoding steps: wall ms per cycle over wall ms per
    plain token (prefill included in both, as a user sees it). Without plain fallback tokens,
    speedup = tau / plain_steps.

    Tokens the plain fallback decoded are plain steps, not cycles: each is charged what its turn's
    plain run paid a token (prefill share included) and taken out of the speculative seconds before
    they are divided by the cycles (`fallback_ms`: what was taken out). Not the generations' own
    `cycle_cost`: that is None without the fallback, a running median of the engine's latest whole
    chunks (warm-up and earlier turns included; 2.0 assumed before any plain chunk was timed), and
    leaves the prefill out, so it would not mean what this figure means with the fallback off. It
    is kept beside it (`engine_plain_steps`, the median over turns). A fallback's draft catch-ups
    and the proposal it resumes with stay in the cycles' time: they are what speculating costs."""
    spec_s = sum(t.spec[label].seconds for t in turns)
    fallback_s = sum(t.spec[label].plain_tokens * t.plain.seconds / max(len(t.plain.tokens), 1) for t in turns)
    cycles = sum(len(t.spec[label].accept_lengths) for t in turns)
    plain_s, plain_tokens = sum(t.plain.seconds for t in turns), sum(len(t.plain.tokens) for t in turns)
    step_ms = 1000 * plain_s / max(plain_tokens, 1)
    cycle_s = spec_s - fallback_s
    # <= 0: the fallback's tokens ran faster than the plain run's (noise); the cycles' time is unknown
    cycle_ms = 1000 * cycle_s / max(cycles, 1) if cycle_s > 0 else None
    engine = [g.cycle_cost for g in (t.spec[label] for t in turns) if g.cycle_cost is not None]
    return {
        "cycle_ms": None if cycle_ms is None else round(cycle_ms, 4),
        "plain_step_ms": round(step_ms, 4),
        "plain_steps": round(cycle_ms / step_ms, 3) if step_ms and cycle_ms is not None else None,
        "fallback_ms": round(1000 * fallback_s, 4),
        "engine_plain_steps": round(statistics.median(engine), 3) if engine else None,
    }


def fallback_summary(gens) -> dict:
    """How much of the speculative runs the plain fallback decoded: its tokens and the fallbacks (their
    share of the tokens: `stats.plain_share`); `plain_fallback`: whether it was on (the engine
    reports a cost it decided with only then)."""
    return {
        "plain_fallback": any(g.cycle_cost is not None for g in gens),
        "plain_tokens": sum(g.plain_tokens for g in gens),
        "fallbacks": sum(g.fallbacks for g in gens),
    }


def fallback_line(summary: dict) -> str | None:
    """One sentence on the plain fallback, so the speedup is read for what it is (None: not recorded)."""
    if "plain_tokens" not in summary:
        return None
    if not summary.get("plain_fallback") and not summary["plain_tokens"]:
        return "Plain fallback off: every token of the speculative runs came from speculation cycles."
    return (
        f"Plain fallback: {summary['plain_tokens']} of {summary['new_tokens']['spec']} tokens of the speculative "
        f"runs ({summary['plain_share']:.0%}) were decoded by plain steps, in {summary['fallbacks']} "
        f"fallback{'' if summary['fallbacks'] == 1 else 's'} "
        "(where the recent cycles committed fewer tokens than a cycle costs); spec tok/s and the speedup include "
        "them, tau and a cycle's cost count the cycles only (`--no-plain-fallback` speculates throughout)."
    )


def throughout_line(t: dict, plain_tokens: int) -> str:
    """The run speculating throughout, in one paragraph: the draft's own tau, per position and category
    (`plain_tokens`: those the fallback's run decoded plainly; none, and the two runs speculated alike)."""
    cats = t.get("by_category") or {}
    why = (
        "This tau is the draft's own accept length: with the fallback, stretches where the draft is weak run "
        "as plain steps and leave the tau, so the tau above reads high."
        if plain_tokens
        else "The fallback's run decoded no token plainly, so the two taus count the same kind of cycles."
    )
    return (
        f"Speculating throughout (no plain fallback; the same engine, the same turns): **tau {t['tau']:.2f}**, "
        f"{t['speedup']:.2f}x; per position "
        + ", ".join(f"{p:.3f}" for p in t["per_position_acceptance"])
        + (
            "; by category " + ", ".join(f"{name} {c['tau']:.2f}" for name, c in cats.items() if c["tau"] is not None)
            if cats
            else ""
        )
        + ". "
        + why
    )


SHORT_TURN = 32  # new tokens a turn below which tok/s and speedups measure the prefill more than the cycle


def verdict(summary: dict, profile: dict | None = None) -> str:
    """One plain sentence: faster or slower than plain decoding, what a cycle costs, and (when the
    cycle was profiled) which part of it costs most."""
    cycle = summary.get("cycle") or {}
    speed = summary["speedup"]
    head = (
        f"Speculation is SLOWER than plain decoding: {speed:.2f}x"
        if speed < 1
        else f"Speculation is {speed:.2f}x faster than plain decoding"
    )
    steps = cycle.get("plain_steps") or 0
    cost = f"a cycle costs {steps:.2f} plain steps" if steps else "a cycle's cost could not be timed"
    text = f"{head} ({summary['spec']}): {cost} and commits tau {summary['tau']:.2f} tokens."
    if summary.get("plain_tokens"):  # the speedup is partly plain decoding's, which a reader must know
        text += (
            f" {summary['plain_share']:.0%} of the speculative runs' tokens were decoded by plain steps "
            "(plain fallback), and the speedup includes them."
        )
    t = summary.get("throughout")
    if t and summary.get("plain_tokens"):  # the tau above is then the fallback's selection of cycles
        text += f" Speculating throughout, the draft's own tau is {t['tau']:.2f} ({t['speedup']:.2f}x)."
    if speed < 1 and steps:  # tau tokens a cycle for `steps` steps' time: it pays above tau = steps
        text += f" A draft pays here only above tau {steps:.2f}."
    if profile:
        parts = {**{name: p["ms"] for name, p in profile["pieces"].items()}, "host": profile["host_ms"]}
        total = max(sum(max(v, 0.0) for v in parts.values()), 1e-9)
        worst = profile["largest"]
        text += (
            f" Largest part of the cycle: {worst} {parts[worst]:.3f} ms ({100 * parts[worst] / total:.0f} %); "
            + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
            + " ms."
        )
    elif speed < 1:
        text += " Run it on a GPU (CUDA graphs) for the split of the cycle into verify, draft and host time."
    tokens, turns = (summary.get("new_tokens") or {}).get("spec"), summary.get("turns")
    if tokens and turns and tokens / turns < SHORT_TURN:  # a few tokens time the prefill and the warm-up, not a cycle
        text += (
            f" The answers average {tokens / turns:.0f} tokens: too short to time speculation "
            f"(use --max-new-tokens {2 * SHORT_TURN} or more)."
        )
    return text


def shape_choice(sweep: list[dict], best: int, timing: dict | None = None) -> dict:
    """Which shape the sweep chose (`best`, the fastest of `sweep`'s rows) and why, in one sentence:
    its speedup on the sweep's prompts, its tau and cycle cost, and its lead over the runner-up;
    a lead within the sweep's plain-run drift (`timing`, `run.bracket`) is called a tie."""
    row = sweep[best]
    others = sorted((r for i, r in enumerate(sweep) if i != best), key=lambda r: r["spec_tok_s"], reverse=True)
    steps = (row.get("cycle") or {}).get("plain_steps")
    cost = f"a cycle {steps:.2f} plain steps" if steps else "a cycle's cost not timed"
    if row.get("plain_tokens"):
        cost += f", {row['plain_share']:.0%} of its tokens by plain fallback steps"
    prompts = f"{row['prompts']} prompt{'' if row['prompts'] == 1 else 's'}"
    why = f"{row['spec']}: {row['speedup']:.2f}x on {prompts} (tau {row['tau']:.2f}, {cost})"
    lead = None
    if others:
        second = others[0]
        lead = row["spec_tok_s"] / second["spec_tok_s"] - 1 if second["spec_tok_s"] else None
        ahead = f"{100 * lead:.0f} % ahead of" if lead is not None else "ahead of"
        why += f", {ahead} {second['spec']} ({second['speedup']:.2f}x)"
        drift = (timing or {}).get("drift")
        if lead is not None and drift and lead < drift:
            why += (
                f"; within the {100 * drift:.0f} % by which the plain runs differed, so on this machine the two "
                "are a tie"
            )
    else:
        why += ", the only shape tried"
    return {
        "chosen": row["spec"],
        "why": why,
        "prompts": row["prompts"],
        "runner_up": others[0]["spec"] if others else None,
        "lead": None if lead is None else round(lead, 4),
        "ranking": [row["spec"]] + [r["spec"] for r in others],
        "drift": (timing or {}).get("drift"),
    }


def turn_records(turns: list[Turn]) -> list[dict]:
    out = []
    for t in turns:
        rec = {
            "id": t.prompt_id,
            "turn": t.turn,
            "prompt_tokens": len(t.ids),
            "plain": {
                "tokens": len(t.plain.tokens),
                "seconds": round(t.plain.seconds, 4),
                "finish": t.plain.finish_reason,
            },
        }
        if t.hf is not None:
            rec["hf"] = {
                "tokens": len(t.hf.tokens),
                "seconds": round(t.hf.seconds, 4),
                "match": t.hf.tokens == t.plain.tokens,
            }
        rec["spec"] = {
            label: {
                "tokens": len(g.tokens),
                "seconds": round(g.seconds, 4),
                "tau": round(g.tau, 3),
                "accept_lengths": g.accept_lengths,
                "match": g.tokens == t.plain.tokens,
                "plain_tokens": g.plain_tokens,
                "fallbacks": g.fallbacks,
                "cycle_cost": None if g.cycle_cost is None else round(g.cycle_cost, 3),
            }
            for label, g in t.spec.items()
        }
        out.append(rec)
    return out


def speedup_line(summary: dict) -> str:
    """The headline's basis and the per-prompt spread beside it, in one sentence."""
    p = summary["per_prompt_speedup"]
    return (
        f"Speedup {summary['speedup']:.2f}x: each method's total tokens over its total time on the same "
        f"{summary['prompts']} prompts. Per prompt: median {p['median']:.2f}x, middle half "
        f"{p['q1']:.2f}-{p['q3']:.2f}x, range {p['min']:.2f}x ({p['min_id']}) to {p['max']:.2f}x ({p['max_id']})."
    )


def drift_warning(summary: dict) -> str | None:
    """The bench's own warning that plain decoding's speed changed during the run, if it gave one."""
    return (summary.get("timing") or {}).get("warning")


def markdown(result: dict) -> str:
    s = result["summary"]
    warning = drift_warning(s)
    lines = [
        f"# eaglekit bench: {result['config']['target']} + {result['config']['draft']}",
        "",
        f"{s['spec']}, {result['config']['sampling']}, max {result['config']['max_new_tokens']} new tokens, "
        f"{s['device']}, {s['date']}",
        "",
    ]
    if warning:  # before the figures it puts in doubt
        lines += [f"**Warning**: {warning}.", ""]
    lines += [
        f"**{s['verdict']}**" if s.get("verdict") else "",
        "",
        "| prompt | turns | tokens | HF tok/s | plain tok/s | spec tok/s | speedup | tau | greedy match | "
        "plain-step tokens |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: | ---: |",
    ]
    fmt = lambda x: "–" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))  # noqa: E731
    share = lambda r: "–" if r.get("plain_share") is None else f"{r['plain_share']:.0%}"  # noqa: E731
    for r in result["prompts"]:
        hf = r.get("hf", {}).get("tok_s")
        lines.append(
            f"| {r['id']} | {r['turns']} | {r['spec']['tokens']} | {fmt(hf)} | {r['plain']['tok_s']:.1f} | "
            f"{r['spec']['tok_s']:.1f} | {r['speedup']:.2f}x | {r['tau']:.2f} | {fmt(r['greedy_match'])} | "
            f"{share(r)} |"
        )
    lines.append(
        f"| **all** | {s['turns']} | {s['new_tokens']['spec']} | {fmt(s['hf_tok_s'])} | "
        f"{s['baseline_tok_s']:.1f} | {s['spec_tok_s']:.1f} | **{s['speedup']:.2f}x** | **{s['tau']:.2f}** | "
        f"{fmt(s['greedy_match'])} | {share(s)} |"
    )
    lines += [""]
    fallback = fallback_line(s)
    if fallback:  # right below the headline it qualifies
        lines += [fallback, ""]
    if s.get("throughout"):
        lines += [throughout_line(s["throughout"], s.get("plain_tokens", 0)), ""]
    if s.get("per_prompt_speedup"):
        lines += [speedup_line(s), ""]
    if s.get("by_category"):
        lines += [
            "| category | prompts | tau | plain tok/s | spec tok/s | speedup | per-prompt median (range) | "
            "plain-step tokens |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, c in s["by_category"].items():
            p = c["per_prompt_speedup"]
            lines.append(
                f"| {name} | {c['prompts']} | {fmt(c['tau'])} | {c['plain_tok_s']:.1f} | "
                f"{c['spec_tok_s']:.1f} | {c['speedup']:.2f}x | {p['median']:.2f}x "
                f"({p['min']:.2f}-{p['max']:.2f}x) | {share(c)} |"
            )
        lines += [""]
    lines += [
        "Per-position acceptance P(first i+1 drafts accepted): "
        + ", ".join(f"{p:.3f}" for p in s["per_position_acceptance"]),
        "",
    ]
    note = greedy_match_note(result)
    if note:
        lines += [note.text, ""]
    if s.get("hf_tok_s"):
        lines += [
            f"HF generate, on the first {s['hf_prompts']} of {s['prompts']} prompts: {s['hf_tok_s']:.1f} tok/s; "
            f"on those prompts plain decoding runs at {s['baseline_vs_hf']:.2f}x and speculation at "
            f"{s['speedup_vs_hf']:.2f}x HF's speed.",
            "",
        ]
    if result.get("sweep"):
        tried = result["sweep"][0]["prompts"]
        where = (
            f"Each shape on all {tried} prompts; the figures above are the chosen one's."
            if tried == s["prompts"]
            else f"Each shape on the first {tried} prompt{'' if tried == 1 else 's'}; the chosen one then ran on "
            f"all {s['prompts']} (the figures above)."
        )
        lines += [
            "## Sweep",
            "",
            where,
            "",
            "| setting | tau | spec tok/s | speedup | cycle (plain steps) | plain-step tokens |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in result["sweep"]:
            steps = (row.get("cycle") or {}).get("plain_steps")
            lines.append(
                f"| {row['spec']} | {row['tau']:.2f} | {row['spec_tok_s']:.1f} | {row['speedup']:.2f}x | "
                f"{fmt(steps)} | {row.get('plain_share', 0):.0%} |"
            )
        choice = s.get("shape_choice")
        lines += ["", f"Chosen: **{choice['why']}**." if choice else f"Fastest: **{s['spec']}**", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class GreedyNote:
    """Why some greedy answers differ from plain decoding's; `bug`: in float32, where they must not."""

    text: str
    bug: bool


def greedy_match_note(result: dict) -> GreedyNote | None:
    """Why some greedy answers differ from plain decoding's, when they do: rounding in a 16-bit
    dtype (expected), or in float32 a sign of a bug (speculation must then reproduce plain greedy)."""
    match = result["summary"].get("greedy_match")
    if match is None or match >= 1:
        return None
    dtype = str(result["summary"].get("config", {}).get("dtype", "")).removeprefix("torch.")
    if dtype == "float32":
        return GreedyNote(
            f"**Greedy match {match:.2f} in float32: speculative greedy output should equal plain decoding "
            "token for token.** Unless two logits tie exactly, this is a bug in the engine: please report "
            "it with this folder.",
            bug=True,
        )
    return GreedyNote(
        f"Greedy match {match:.2f}: in {dtype or 'this dtype'} the verify forward (several tokens at once) "
        "rounds differently from plain decoding's one-token step, and one near-tie decided the other way "
        "changes the rest of the answer. Every token speculation commits is still the target's own greedy "
        "choice in its verify forward; in float32 (`--dtype float32`) the two outputs are identical token "
        "for token.",
        bug=False,
    )


def plot(result: dict, path: Path) -> str | None:
    """Write the PNG (acceptance per position, tau per prompt); return why not if matplotlib is missing."""
    try:  # here, not at the top: choosing the Agg backend is process-wide, for plot writers only
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'eaglekit[plots]'): no plot written"
    s = result["summary"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    acc = s["per_position_acceptance"]
    left.bar(range(1, len(acc) + 1), acc, color="#3b7dd8")
    left.set(
        xlabel="draft position / depth i",
        ylabel="P(first i drafts accepted)",
        ylim=(0, 1),
        title=f"acceptance ({s['spec']})",
        xticks=range(1, len(acc) + 1),
    )
    taus = [r["tau"] for r in result["prompts"]]
    right.bar(range(len(taus)), taus, color="#d8843b")
    if len(taus) <= 24:
        right.set_xticks(range(len(taus)), [r["id"] for r in result["prompts"]], rotation=60, fontsize=7)
    right.axhline(s["tau"], color="black", linestyle="--", linewidth=1, label=f"mean {s['tau']:.2f}")
    right.set(xlabel="prompt", ylabel="tau (tokens per target forward)", title="tau per prompt")
    right.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return None
