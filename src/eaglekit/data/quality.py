"""What the target's answers are made of, beyond their count: the loops a small target falls into.

Greedy decoding of a small model often ends in a loop (the same sentence or token block again and
again) until the token limit cuts it. Such tails are easy to draft and teach little, yet they can
be most of the answer tokens (as in SmolLM2's answers cut at 1024 on one recipe run:
docs/results/2026-12-01-h200-recipe), so the generate manifest says how many tokens are loops.
"""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 64  # longest repeated block looked for, in tokens
MIN_REPEATS = 3  # a tail counts as a loop when its block occurs at least this often


def loop_tail(tokens: list[int], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS) -> int:
    """How many trailing tokens repeat a block of at most `max_period` tokens, at least `min_repeats`
    times in a row (the first occurrence included); 0 when the answer does not end in a loop.

    For each period p, the tail where token i equals token i - p is found with one vectorized
    comparison; the loop covers that run plus the block it repeats.
    """
    ids = np.asarray(tokens, dtype=np.int64)
    best = 0
    for p in range(1, min(max_period, len(ids) // min_repeats) + 1):
        same = ids[p:] == ids[:-p]  # [n - p]: token i + p repeats token i
        breaks = np.flatnonzero(~same)
        run = len(same) - 1 - (int(breaks[-1]) if len(breaks) else -1)  # trailing repeats
        if run and run + p >= min_repeats * p:
            best = max(best, run + p)
    return best
