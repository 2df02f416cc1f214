"""Trivial predictors a draft must beat, scored like step 0 on the held-out data.

At every counted position s (x_s and x_{s+1} written by the assistant) the task is to name
x_{s+1}, which on target-generated data is the target's greedy token:

- unigram: always the most frequent next token of the training data;
- bigram:  the most frequent successor of x_s in the training data (unigram when x_s is unseen).

A tie goes to the token seen first in the training data (as `Counter.most_common` breaks it). The
counting is vectorized: tens of millions of training positions, once per run.
"""

from __future__ import annotations

import torch

from eaglekit.train.ttt import counted_positions


def pairs(token_masks) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_s, x_{s+1}) at counted positions of each (input_ids, loss_mask), in sample then position order.

    Returns:
        ([N] int64 x_s, [N] int64 x_{s+1}).
    """
    ids, masks = [], []
    for sample_ids, mask in token_masks:
        ids.append(torch.as_tensor(sample_ids, dtype=torch.long))
        masks.append(torch.as_tensor(mask).bool())
    if not ids:
        ids, masks = [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.bool)]
    ids, mask = torch.cat(ids), torch.cat(masks)  # [T] all samples end to end
    last = torch.zeros_like(mask)
    ends = torch.tensor([m.numel() for m in masks], dtype=torch.long).cumsum(0) - 1
    last[ends[ends >= 0]] = True  # each sample's final position
    counted = (counted_positions(mask[None])[0] & ~last).nonzero().squeeze(1)  # x_{s+1} in the same sample
    return ids[counted], ids[counted + 1]


def tally(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct values of [N] `values` (ascending), their counts and first positions, all [U]."""
    ordered, order = torch.sort(values, stable=True)  # stable: a run's first entry is its first position
    distinct, counts = torch.unique_consecutive(ordered, return_counts=True)
    return distinct, counts, order[counts.cumsum(0) - counts]


def rank(counts: torch.Tensor, first: torch.Tensor, n: int) -> torch.Tensor:
    """Larger for more counts, then for an earlier first position (< n; distinct per entry). Exact
    in int64: count * (n + 1) + n < 2**63 for n < 3e9 positions."""
    return counts * (n + 1) + (n - first)


def group_winners(groups: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """[U] bool: the entry of largest (distinct) `score` in each group. groups, score: [U]."""
    best = torch.full((int(groups.max()) + 1,), -1, dtype=torch.long).scatter_reduce_(0, groups, score, "amax")
    return score == best[groups]


def baseline_accuracy(train_token_masks, val_token_masks) -> dict:
    """Step-0-style accuracy of the unigram and bigram predictors on the validation data."""
    cur, nxt = pairs(train_token_masks)
    if not nxt.numel():
        return {"unigram_acc": None, "bigram_acc": None, "positions": 0}
    n, size = nxt.numel(), int(max(cur.max(), nxt.max())) + 1
    first = torch.full((size,), n).scatter_reduce_(0, nxt, torch.arange(n), "amin")  # [size]
    top = int(rank(torch.bincount(nxt, minlength=size), first, n).argmax())
    bigrams, counts, first = tally(cur * size + nxt)  # [U] (x_s, x_{s+1}) as one key
    best = group_winners(bigrams // size, rank(counts, first, n))
    best_next = torch.full((size,), top, dtype=torch.long)  # [size] successor of each x_s
    best_next[bigrams[best] // size] = bigrams[best] % size
    val_cur, val_nxt = pairs(val_token_masks)
    guess = torch.where(val_cur < size, best_next[val_cur.clamp(max=size - 1)], top)
    n = val_nxt.numel()
    uni, bi = int((val_nxt == top).sum()), int((val_nxt == guess).sum())
    return {"unigram_acc": round(uni / max(n, 1), 5), "bigram_acc": round(bi / max(n, 1), 5), "positions": n}
