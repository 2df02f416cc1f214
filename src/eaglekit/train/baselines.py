"""Trivial predictors a draft must beat, scored like step 0 on the held-out data.

At every counted position s (x_s and x_{s+1} written by the assistant) the task is to name
x_{s+1}, which on target-generated data is the target's greedy token:

- unigram: always the most frequent next token of the training data;
- bigram:  the most frequent successor of x_s in the training data (unigram when x_s is unseen).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from eaglekit.train.ttt import counted_positions


def pairs(token_masks):
    """(x_s, x_{s+1}) at counted positions of each (input_ids, loss_mask)."""
    for ids, mask in token_masks:
        ids = torch.as_tensor(ids)
        counted = counted_positions(torch.as_tensor(mask).bool()[None])[0]
        idx = counted.nonzero().squeeze(1)
        idx = idx[idx + 1 < ids.numel()]
        yield from zip(ids[idx].tolist(), ids[idx + 1].tolist())


def baseline_accuracy(train_token_masks, val_token_masks) -> dict:
    """Step-0-style accuracy of the unigram and bigram predictors on the validation data."""
    unigram: Counter = Counter()
    bigram: dict[int, Counter] = defaultdict(Counter)
    for cur, nxt in pairs(train_token_masks):
        unigram[nxt] += 1
        bigram[cur][nxt] += 1
    if not unigram:
        return {"unigram_acc": None, "bigram_acc": None, "positions": 0}
    top = unigram.most_common(1)[0][0]
    best_next = {cur: c.most_common(1)[0][0] for cur, c in bigram.items()}
    n = uni = bi = 0
    for cur, nxt in pairs(val_token_masks):
        n += 1
        uni += nxt == top
        bi += nxt == best_next.get(cur, top)
    return {"unigram_acc": round(uni / max(n, 1), 5), "bigram_acc": round(bi / max(n, 1), 5), "positions": n}
