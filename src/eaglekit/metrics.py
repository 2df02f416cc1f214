"""Speculative-decoding metrics, one definition each: what train, engine, doctor and bench report.

tau (accept length) is the number of tokens committed per target forward, the bonus token included:
1.00 means no draft was accepted. Acceptance by position follows vLLM: P(the first i+1 drafts were
all accepted). Training predicts tau two ways from its per-step sums (`STATS`, which the TTT loss in
train/loss.py accumulates): the per-position estimate 1 + sum_j prod_{i<=j} cond_i, and the serving
walk, greedy chain decoding replayed over the data, which weights positions as serving does.

No torch here: the functions take lists (a tensor's `tolist()` works where a tensor is passed), so
every package can import this module, and a torch-free `--help` too.
"""

from __future__ import annotations

# The per-step sums of one TTT unroll (train/loss.py `score_step`; the walk columns in `ttt_loss`):
#   valid       positions the step counts       correct     ... whose draft argmax is the target's
#   chain       ... right after a right chain   chain_prev  ... after a right chain (cond's denominator)
#   loss_sum    soft CE summed                  counted     ... with the target's argmax in the draft vocab
#   agree       ... whose next data token is the target's argmax
#   walk_tokens, walk_cycles: the serving walk with a chain of j + 1 drafts (validation only)
STATS = ("valid", "correct", "chain", "chain_prev", "loss_sum", "counted", "agree", "walk_tokens", "walk_cycles")


def accept_length(accepts: list[int]) -> float:
    """tau: tokens committed per verify, the bonus token included (1 + mean accepted drafts); 1.0
    when there was no cycle."""
    return 1 + sum(accepts) / len(accepts) if accepts else 1.0


def acceptance_by_position(accepts: list[int], positions: int) -> list[float]:
    """Per draft position i (0-based), the share of cycles that accepted at least i + 1 drafts."""
    if not accepts:
        return [0.0] * positions
    return [sum(a > i for a in accepts) / len(accepts) for i in range(positions)]


def cumulative_acceptance(cond: list[float]) -> list[float]:
    """P(the first j+1 drafts are all accepted) from per-step conditional acceptance: the running
    products; 1 + their sum over the first k steps is the accept length a chain of k is predicted."""
    running, out = 1.0, []
    for c in cond:
        running *= float(c)
        out.append(running)
    return out


def serving_walk(start_mask, run, max_drafts: int | None = None) -> tuple[int, int]:
    """Replay greedy chain decoding over the data: (tokens committed, target forwards).

    A cycle that starts at draft position t (last committed token x_{t+1}) accepts the run[t]
    leading correct drafts (at most `max_drafts`: the serving chain's k) plus one token from the
    target, so the next cycle starts at t + run[t] + 1. Walking every assistant span this way
    weights positions as serving does (hard stretches produce more cycles), which the per-position
    average 1 + sum_j prod cond_j does not.

    Args:
        start_mask: [B, L] bool, step-0 counted positions (the spans the draft is asked to continue).
        run: [B, L] int, leading correct steps of each position's chain (0..ttt_steps).
        max_drafts: the chain length k served (None: ttt_steps).
    """
    return serving_walks(start_mask, run, [max_drafts])[0]


def serving_walks(start_mask, run, max_drafts: list[int | None]) -> list[tuple[int, int]]:
    """`serving_walk` for several served chain lengths, reading tensors to the host once."""
    rows = list(zip(as_lists(start_mask), as_lists(run)))
    return [walk_rows(rows, k) for k in max_drafts]


def as_lists(x) -> list:
    """A tensor (read to the host) or nested lists, as nested lists."""
    return x.cpu().tolist() if hasattr(x, "cpu") else x


def walk_rows(rows: list[tuple[list[bool], list[int]]], max_drafts: int | None) -> tuple[int, int]:
    tokens = cycles = 0
    for mask_row, run_row in rows:
        t, L = 0, len(mask_row)
        while t < L:
            if not mask_row[t]:
                t += 1
                continue
            end = t
            while end < L and mask_row[end]:
                end += 1
            while t < end:  # one assistant span
                n = run_row[t] if max_drafts is None else min(run_row[t], max_drafts)
                tokens += n + 1
                cycles += 1
                t += n + 1
            t = max(t, end)
    return tokens, cycles


def metrics_from_stats(stats) -> dict:
    """Per-step acc_j, conditional acceptance, cumulative acceptance and the simulated accept length.

    stats: [ttt_steps, len(STATS)] sums (a tensor, e.g. all-reduced over ranks, or lists).

    acc_j   = correct_j / valid_j (unconditional)
    cond_j  = P(step j correct | steps 0..j-1 correct)
    tau     = 1 + sum_j prod_{i<=j} cond_i (tokens per target forward with a chain of ttt_steps drafts)
    walk_accept_length: tokens per target forward when greedy chain decoding is replayed over the
        data (`serving_walk`; validation only): what an engine measures on these prompts.
    walk_accept_length_by_k: the same for a served chain of k = 1 .. the steps unrolled (the per-step
        estimate 1 + sum prod cond over-predicts a served chain: it weights positions evenly).
    data_greedy_agreement: share of counted positions whose next token in the data is the target's
        argmax; near 1 on data the target regenerated greedily, low on data written by someone else
        (then acc_j, measured against the target, and ground-truth-token baselines diverge).
    """
    rows = [[float(x) for x in row] for row in as_lists(stats)]
    col = {name: [row[i] for row in rows] for i, name in enumerate(STATS)}
    walks = [round(t / c, 5) for t, c in zip(col["walk_tokens"], col["walk_cycles"]) if c > 0]
    acc = [c / max(v, 1.0) for c, v in zip(col["correct"], col["valid"])]
    cond = [c / max(p, 1.0) for c, p in zip(col["chain"], col["chain_prev"])]
    cumulative = cumulative_acceptance(cond)
    tau = 1.0 + sum(cumulative)
    valid0 = col["valid"][0]
    return {
        "acc": [round(a, 5) for a in acc],
        "cond_acc": [round(c, 5) for c in cond],
        "cum_acc": [round(c, 5) for c in cumulative],
        "sim_accept_length": round(tau, 5),
        "ce": [round(s / max(n, 1.0), 5) for s, n in zip(col["loss_sum"], col["counted"])],
        "positions": int(valid0),
        "data_greedy_agreement": round(col["agree"][0] / max(valid0, 1.0), 5),
        "walk_accept_length": walks[-1] if walks else None,
        "walk_accept_length_by_k": walks or None,
        "oov_share": round(1 - col["counted"][0] / max(valid0, 1.0), 5),
    }
