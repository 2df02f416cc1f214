"""The bench's speed figures from per-prompt rows (`report.summarize`'s), in one place for the bench and
`eaglekit report`; no torch here.

A method's tok/s over some prompts is its total tokens over its total seconds on them, so every token
weighs alike and a cycle's cost predicts it (speedup ~ tau / plain steps); a mean of per-prompt rates
lets one short, fast prompt outweigh the rest. The per-prompt speedups are reported beside it as a
median and a spread.
"""

from __future__ import annotations

import statistics


def rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def total_rate(rows: list[dict], key: str) -> float:
    """A method's tokens over its seconds, summed over the rows (prompts) it ran."""
    return rate(sum(r[key]["tokens"] for r in rows), sum(r[key]["seconds"] for r in rows))


def spread(rows: list[dict]) -> dict | None:
    """The per-prompt speedups: median, middle half (quartiles), range and the prompts at its ends."""
    if not rows:
        return None
    values = [r["speedup"] for r in rows]
    low, high = min(rows, key=lambda r: r["speedup"]), max(rows, key=lambda r: r["speedup"])
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {
        "median": round(statistics.median(values), 3),
        "q1": round(q1, 3),
        "q3": round(q3, 3),
        "min": low["speedup"],
        "max": high["speedup"],
        "min_id": low["id"],
        "max_id": high["id"],
    }


def group_stats(rows: list[dict]) -> dict:
    """tau (weighted by cycles, as the overall tau is) and the total-time speedup of some prompts."""
    cycles = sum(r["cycles"] for r in rows)
    accepted = sum((r["tau"] - 1) * r["cycles"] for r in rows)
    plain, spec = total_rate(rows, "plain"), total_rate(rows, "spec")
    return {
        "prompts": len(rows),
        "cycles": cycles,
        "tau": round(1 + accepted / cycles, 3) if cycles else None,
        "plain_tok_s": round(plain, 2),
        "spec_tok_s": round(spec, 2),
        "speedup": round(rate(spec, plain), 3),
        "per_prompt_speedup": spread(rows),
        "plain_share": plain_share(rows),
    }


def plain_share(rows: list[dict]) -> float:
    """The share of the speculative runs' tokens that the plain fallback decoded (rows of results
    written before the fallback have no `plain_tokens`: none)."""
    tokens = sum(r["spec"]["tokens"] for r in rows)
    return round(sum(r.get("plain_tokens", 0) for r in rows) / tokens, 4) if tokens else 0.0


def grouped(rows: list[dict], categories: dict[str, str]) -> dict[str, list[dict]]:
    """The rows by prompt category (`categories`: prompt id -> category; "unknown" where it has none)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(categories.get(row["id"], "unknown"), []).append(row)
    return groups


def by_category(rows: list[dict], categories: dict[str, str] | None) -> dict[str, dict] | None:
    """Per prompt category (MT-bench's writing, coding, ...), when the prompts fall in two or more."""
    if not categories:
        return None
    groups = grouped(rows, categories)
    return {name: group_stats(group) for name, group in groups.items()} if len(groups) > 1 else None
