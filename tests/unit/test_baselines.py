"""Unigram / bigram baselines: the vectorized counting agrees with Counter-based counting, ties included."""

from collections import Counter, defaultdict

import torch

from eaglekit.train.baselines import baseline_accuracy


def counter_baselines(train, val) -> dict:
    """The baselines as Counters compute them (ties: the token counted first), position by position."""

    def pairs(token_masks):
        for ids, mask in token_masks:
            ids, mask = list(ids), [bool(m) for m in mask]
            for s in range(len(ids) - 1):
                if mask[s] and mask[s + 1]:
                    yield int(ids[s]), int(ids[s + 1])

    unigram, bigram = Counter(), defaultdict(Counter)
    for cur, nxt in pairs(train):
        unigram[nxt] += 1
        bigram[cur][nxt] += 1
    if not unigram:
        return {"unigram_acc": None, "bigram_acc": None, "positions": 0}
    top = unigram.most_common(1)[0][0]
    best = {cur: c.most_common(1)[0][0] for cur, c in bigram.items()}
    n = uni = bi = 0
    for cur, nxt in pairs(val):
        n, uni, bi = n + 1, uni + (nxt == top), bi + (nxt == best.get(cur, top))
    return {"unigram_acc": round(uni / max(n, 1), 5), "bigram_acc": round(bi / max(n, 1), 5), "positions": n}


def random_masks(n: int, vocab: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=gen).tolist()
    return [(torch.randint(0, vocab, (t,), generator=gen), torch.rand(t, generator=gen) < 0.7) for t in lengths]


def test_baselines_match_counters():
    for seed, vocab in ((0, 6), (1, 30), (2, 200)):  # small vocabularies: many ties
        train, val = random_masks(60, vocab, seed) + [([], [])], random_masks(20, vocab + 5, seed + 100)
        assert baseline_accuracy(train, val) == counter_baselines(train, val)


def test_ties_go_to_the_first_seen_token():
    train = [([1, 5, 1, 4], [1, 1, 1, 1]), ([1, 4, 1, 5, 0, 4], [1, 1, 1, 1, 0, 1])]  # 1 -> 5, 4: twice each
    assert baseline_accuracy(train, [([1, 5], [1, 1])])["bigram_acc"] == 1.0
    assert baseline_accuracy(train, [([1, 4], [1, 1])])["bigram_acc"] == 0.0
    # unigram: 5, 1 and 4 twice each, 5 first; an unseen x_s falls back to it
    assert baseline_accuracy(train, [([9, 5], [1, 1])]) == {"unigram_acc": 1.0, "bigram_acc": 1.0, "positions": 1}
    assert baseline_accuracy(train, [([9, 4], [1, 1])]) == {"unigram_acc": 0.0, "bigram_acc": 0.0, "positions": 1}


def test_no_counted_positions():
    empty = {"unigram_acc": None, "bigram_acc": None, "positions": 0}
    assert baseline_accuracy([], []) == empty == baseline_accuracy([([3, 4], [1, 0])], [([3, 4], [1, 1])])
    assert baseline_accuracy([([], [])], [([], [])]) == empty
    assert baseline_accuracy([([3, 4], [1, 1])], []) == {"unigram_acc": 0.0, "bigram_acc": 0.0, "positions": 0}
