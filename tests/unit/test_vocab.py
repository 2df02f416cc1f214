"""The draft vocabulary: top-N assistant tokens, ascending ids, d2t offsets, t2d mask, coverage."""

import pytest
import torch

from eaglekit.draft import vocab as vocab_mod
from eaglekit.draft.vocab import DraftVocab, build_draft_vocab, count_assistant_tokens
from eaglekit.errors import EaglekitError


def counts_of(pairs, V=20):
    return count_assistant_tokens(pairs, V)


def test_counts_only_assistant_tokens():
    counts = counts_of([([5, 6, 6, 7], [0, 1, 1, 0]), ([7, 7, 3], [1, 1, 1])])
    assert counts[6] == 2 and counts[7] == 2 and counts[3] == 1 and counts[5] == 0 and counts.sum() == 5


def test_counts_over_chunks_are_per_sample_counts(monkeypatch):
    """Counting bincounts many samples at once: the same counts as one bincount per sample."""
    monkeypatch.setattr(vocab_mod, "COUNT_CHUNK", 7)
    gen = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(0, 50, (n,), generator=gen), torch.rand(n, generator=gen) < 0.6) for n in range(0, 30, 3)]
    expected = sum(torch.bincount(ids[mask], minlength=50) for ids, mask in pairs)
    assert torch.equal(count_assistant_tokens(iter(pairs), 50), expected)
    assert torch.equal(count_assistant_tokens(((i.tolist(), m.int().tolist()) for i, m in pairs), 50), expected)
    assert count_assistant_tokens([], 50).tolist() == [0] * 50


def test_top_n_sorted_ascending_with_offsets_and_mask():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[15, 3, 9, 11, 4]] = torch.tensor([50, 40, 30, 20, 10])
    vocab = build_draft_vocab(counts, 3)
    assert vocab.draft_ids.tolist() == [3, 9, 15]
    assert vocab.d2t.dtype == torch.int64 and vocab.d2t.tolist() == [3, 8, 13]  # offsets, not ids
    draft = torch.arange(3)
    assert (draft + vocab.d2t[draft]).tolist() == [3, 9, 15]
    assert vocab.t2d.dtype == torch.bool and vocab.t2d.nonzero().squeeze(1).tolist() == [3, 9, 15]
    assert vocab.target_to_draft[[3, 9, 15, 4]].tolist() == [0, 1, 2, -1]
    assert vocab.coverage == pytest.approx(120 / 150)


def test_end_of_turn_always_included_even_if_rare():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[1, 2, 3]] = torch.tensor([9, 8, 7])
    vocab = build_draft_vocab(counts, 3, always_include=[17])
    assert 17 in vocab.draft_ids.tolist() and vocab.size == 3
    assert vocab.draft_ids.tolist() == [1, 2, 17]


def test_ties_are_broken_by_lower_id():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[12, 4, 8]] = 5
    assert build_draft_vocab(counts, 2).draft_ids.tolist() == [4, 8]


def test_fewer_distinct_tokens_than_asked_is_a_clear_error_or_explicitly_smaller():
    counts = torch.zeros(20, dtype=torch.long)
    counts[[2, 5, 7]] = 1
    with pytest.raises(EaglekitError, match=r"only 4 distinct assistant tokens.*draft_vocab_size 10") as err:
        build_draft_vocab(counts, 10, always_include=[19])
    assert "--allow-smaller-vocab" in err.value.hint
    vocab = build_draft_vocab(counts, 10, always_include=[19], allow_smaller=True)
    assert vocab.draft_ids.tolist() == [2, 5, 7, 19]


def test_no_assistant_tokens_and_bad_sizes_are_refused():
    with pytest.raises(EaglekitError, match="no assistant tokens"):
        build_draft_vocab(torch.zeros(20, dtype=torch.long), 5)
    counts = torch.ones(20, dtype=torch.long)
    with pytest.raises(EaglekitError, match="must be in 1..20"):
        build_draft_vocab(counts, 21)
    with pytest.raises(EaglekitError, match="token id 25 is outside the target vocab"):
        count_assistant_tokens([([25], [1])], 20)
    with pytest.raises(EaglekitError, match="token id -1 is outside the target vocab"):
        count_assistant_tokens([([3, -1], [1, 1])], 20)


def test_save_load_round_trip(tmp_path):
    counts = torch.arange(20, dtype=torch.long)
    vocab = build_draft_vocab(counts, 6, always_include=[0])
    path = vocab.save(tmp_path)
    assert path.name == "vocab.safetensors"
    again = DraftVocab.load(tmp_path)
    assert torch.equal(again.draft_ids, vocab.draft_ids) and again.coverage == pytest.approx(vocab.coverage)
    assert again.forced_ids == [0]


def test_absolute_ids_in_d2t_are_detected():
    # An engine reading absolute ids as offsets would map past the vocab: from_d2t must refuse.
    absolute = torch.tensor([3, 9, 15])
    with pytest.raises(EaglekitError):
        DraftVocab.from_d2t(absolute, 16)
