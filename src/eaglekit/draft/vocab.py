"""The draft vocabulary: which target tokens the draft's lm_head can propose.

Built from how often each token is written by the assistant in the training conversations (the
loss-masked tokens: what the draft has to predict). The `draft_vocab_size` most frequent ids are
kept and sorted ascending; the target's end-of-turn / EOS ids are always kept (a draft that cannot
propose the end of an answer misses every last token). Engines read two tensors:

    d2t [Vd] int64   offsets: target_id = draft_id + d2t[draft_id]   (never absolute ids)
    t2d [V]  bool    True where the target id is in the draft vocab

`coverage` is the share of assistant tokens the draft vocab can express; 1 - coverage of the
positions can never be accepted, whatever the draft learns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglekit.artifacts import atomic_path
from eaglekit.errors import EaglekitError

VOCAB_FILE = "vocab.safetensors"
COUNT_CHUNK = 1 << 22  # ids per bincount: each call costs O(V), so one per ~4M tokens, not one per conversation


@dataclass
class DraftVocab:
    """A draft vocabulary: the kept target ids, ascending, and how well they cover the data.

    Attributes:
        draft_ids: [Vd] int64 target ids, strictly ascending.
        vocab_size: the target's vocabulary size V.
        coverage: share of counted assistant tokens whose id is kept (None if unknown).
        forced_ids: ids kept regardless of frequency (end of turn, EOS).
        counted_tokens: how many assistant tokens were counted.
    """

    draft_ids: torch.Tensor
    vocab_size: int
    coverage: float | None = None
    forced_ids: list[int] = field(default_factory=list)
    counted_tokens: int = 0

    def __post_init__(self):
        ids = self.draft_ids.to(torch.long)
        if ids.dim() != 1 or ids.numel() == 0:
            raise EaglekitError("a draft vocab needs a non-empty 1-D list of ids", hint="internal error")
        if bool((ids[1:] <= ids[:-1]).any()):
            raise EaglekitError("draft vocab ids must be strictly ascending", hint="internal error")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise EaglekitError(
                f"draft vocab ids must lie in 0..{self.vocab_size - 1}",
                hint="the vocab was made for a larger target vocabulary",
            )
        self.draft_ids = ids

    @property
    def size(self) -> int:
        return int(self.draft_ids.numel())

    @property
    def d2t(self) -> torch.Tensor:
        """[Vd] int64 offsets: target_id = draft_id + d2t[draft_id]."""
        return self.draft_ids - torch.arange(self.size, dtype=torch.long)

    @property
    def t2d(self) -> torch.Tensor:
        """[V] bool: True where the target id is in the draft vocab."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.draft_ids] = True
        return mask

    @property
    def target_to_draft(self) -> torch.Tensor:
        """[V] int64: the draft id of each target id, -1 where the id is outside the draft vocab."""
        index = torch.full((self.vocab_size,), -1, dtype=torch.long)
        index[self.draft_ids] = torch.arange(self.size, dtype=torch.long)
        return index

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> "DraftVocab":
        """Rebuild from an engine's offset table (checks that it really holds offsets)."""
        ids = d2t.to(torch.long) + torch.arange(d2t.numel(), dtype=torch.long)
        return cls(draft_ids=ids, vocab_size=vocab_size)

    def apply_to(self, draft) -> None:
        """Write d2t and t2d into a draft model's buffers (shapes must match its config)."""
        if draft.d2t.numel() != self.size or draft.t2d.numel() != self.vocab_size:
            raise EaglekitError(
                f"vocab of {self.size}/{self.vocab_size} ids does not fit a draft with "
                f"draft_vocab_size {draft.d2t.numel()} and vocab_size {draft.t2d.numel()}",
                hint="build the draft config with this vocab's size",
            )
        with torch.no_grad():
            draft.d2t.copy_(self.d2t.to(draft.d2t.device))
            draft.t2d.copy_(self.t2d.to(draft.t2d.device))

    def summary(self) -> dict:
        return {
            "draft_vocab_size": self.size,
            "vocab_size": self.vocab_size,
            "coverage": self.coverage,
            "forced_ids": list(self.forced_ids),
            "counted_tokens": self.counted_tokens,
        }

    def save(self, path: str | Path) -> Path:
        """Write `vocab.safetensors` (d2t, t2d; summary in the metadata) atomically."""
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path / VOCAB_FILE
        with atomic_path(path) as tmp:
            save_file(
                {"d2t": self.d2t.contiguous(), "t2d": self.t2d.contiguous()},
                str(tmp),
                metadata={"eaglekit_vocab": json.dumps(self.summary())},
            )
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DraftVocab":
        path = Path(path)
        if path.is_dir():
            path = path / VOCAB_FILE
        if not path.is_file():
            raise EaglekitError(f"no draft vocab at {path}", hint="run `eaglekit vocab` or pass its output")
        from eaglekit.targets.source import validate_safetensors

        validate_safetensors(path)
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            if not {"d2t", "t2d"} <= names:
                raise EaglekitError(f"{path} lacks d2t/t2d tensors", hint="pass a vocab written by eaglekit")
            d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
            meta = json.loads((f.metadata() or {}).get("eaglekit_vocab", "{}"))
        vocab = cls.from_d2t(d2t, t2d.numel())
        if not torch.equal(vocab.t2d, t2d.to(torch.bool)):
            raise EaglekitError(f"{path}: d2t and t2d disagree", hint="the file is corrupt; rebuild the vocab")
        vocab.coverage = meta.get("coverage")
        vocab.forced_ids = list(meta.get("forced_ids", []))
        vocab.counted_tokens = int(meta.get("counted_tokens", 0))
        return vocab

    def coverage_of(self, counts: torch.Tensor) -> float:
        """Share of the tokens counted in `counts` ([V]) that this vocab can express."""
        total = int(counts.sum())
        return float(counts[self.draft_ids].sum()) / total if total else 0.0


def count_assistant_tokens(
    samples: Iterable[tuple[list[int] | torch.Tensor, list[int] | torch.Tensor]], vocab_size: int
) -> torch.Tensor:
    """Count each target id over the assistant (loss-masked) tokens.

    Args:
        samples: (input_ids, loss_mask) pairs, one per conversation.
        vocab_size: the target's vocabulary size.

    Returns:
        [V] int64 counts.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    picked: list[torch.Tensor] = []
    held = 0
    for ids, mask in samples:
        ids = torch.as_tensor(ids, dtype=torch.long)
        picked.append(ids[torch.as_tensor(mask).to(torch.bool)])
        held += picked[-1].numel()
        if held >= COUNT_CHUNK:
            counts += bincount_ids(torch.cat(picked), vocab_size)
            picked, held = [], 0
    if picked:
        counts += bincount_ids(torch.cat(picked), vocab_size)
    return counts


def bincount_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N] int64 ids -> [V] int64 counts; refuses ids outside the vocabulary."""
    top, low = (int(ids.max()), int(ids.min())) if ids.numel() else (0, 0)
    if top >= vocab_size or low < 0:
        raise EaglekitError(
            f"token id {top if top >= vocab_size else low} is outside the target vocab ({vocab_size})",
            hint="the data was tokenized with another tokenizer",
        )
    return torch.bincount(ids, minlength=vocab_size)


def build_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int, *, always_include: Iterable[int] = (), allow_smaller: bool = False
) -> DraftVocab:
    """Keep the `draft_vocab_size` most frequent assistant tokens (plus `always_include`).

    Ties are broken by the lower id, so the result is a pure function of the counts. Ids never seen
    in the data are not padded in: a draft cannot learn to propose them.

    Args:
        counts: [V] int64 assistant-token counts (`count_assistant_tokens`).
        draft_vocab_size: rows of the draft's lm_head.
        always_include: ids kept whatever their count (end of turn, EOS).
        allow_smaller: when the data holds fewer distinct tokens than asked, keep all of them
            (a smaller draft vocab) instead of raising.

    Raises:
        EaglekitError: no assistant tokens, a size out of range, or fewer distinct tokens than asked
            without `allow_smaller`.
    """
    counts = torch.as_tensor(counts, dtype=torch.long)
    vocab_size = counts.numel()
    total = int(counts.sum())
    if total == 0:
        raise EaglekitError(
            "the data holds no assistant tokens to count",
            hint="check that the conversations have assistant answers (loss mask is empty)",
        )
    if not 0 < draft_vocab_size <= vocab_size:
        raise EaglekitError(
            f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab_size} (the target vocab)",
            hint="choose a smaller --draft-vocab-size",
        )
    forced = sorted({int(i) for i in always_include})
    bad = [i for i in forced if not 0 <= i < vocab_size]
    if bad:
        raise EaglekitError(f"forced ids {bad} are outside the target vocab", hint="internal error")
    if len(forced) > draft_vocab_size:
        raise EaglekitError(
            f"draft_vocab_size {draft_vocab_size} cannot even hold the {len(forced)} end-of-turn/EOS ids",
            hint="choose a larger --draft-vocab-size",
        )
    seen = counts > 0
    seen[forced] = True
    distinct = int(seen.sum())
    if distinct < draft_vocab_size:
        if not allow_smaller:
            raise EaglekitError(
                f"the data holds only {distinct} distinct assistant tokens (end-of-turn/EOS included), fewer "
                f"than draft_vocab_size {draft_vocab_size}",
                hint=f"pass --draft-vocab-size {distinct} or less, add data, or pass --allow-smaller-vocab "
                "to keep all of them as a smaller vocab",
            )
        draft_vocab_size = distinct
    # Order: forced ids first, then by count descending, ties by id ascending (stable sort on ids).
    key = counts.clone()
    key[forced] = total + 1
    order = torch.sort(key, descending=True, stable=True).indices
    kept = torch.sort(order[:draft_vocab_size]).values
    vocab = DraftVocab(draft_ids=kept, vocab_size=vocab_size, forced_ids=forced, counted_tokens=total)
    vocab.coverage = vocab.coverage_of(counts)
    return vocab


def d2t_problems(d2t: torch.Tensor, t2d: torch.Tensor | None, draft_vocab: int, vocab: int) -> tuple[list[str], str]:
    """What is wrong with a d2t/t2d pair; the second value is the fix."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        return [f"d2t is {d2t.dtype}, not an integer tensor"], "store d2t as int64 offsets"
    if d2t.shape != (draft_vocab,):
        return [f"d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab},)"], "d2t needs one offset per draft id"
    d2t = d2t.long()
    ids = torch.arange(draft_vocab) + d2t  # what every engine computes: target = draft id + d2t[draft id]
    ok = bool((ids >= 0).all() and (ids < vocab).all() and (ids[1:] > ids[:-1]).all())
    if not ok:
        absolute = bool((d2t >= 0).all() and (d2t < vocab).all() and (d2t[1:] > d2t[:-1]).all())
        if absolute:
            return [
                "d2t holds absolute target ids, engines add them to the draft id (target = i + d2t[i]): "
                f"{int((ids >= vocab).sum())} draft ids map outside the vocab, all others to wrong tokens"
            ], "store offsets: d2t[i] = target_id[i] - i"
        return [
            "d2t offsets give target ids that are negative, out of the vocab or not strictly increasing"
        ], "rebuild d2t from the sorted draft vocabulary: d2t[i] = target_id[i] - i"
    problems = []
    if t2d is not None:
        if t2d.dtype != torch.bool or t2d.shape != (vocab,):
            problems.append(f"t2d is {t2d.dtype} {tuple(t2d.shape)}, expected bool ({vocab},)")
        elif int(t2d.sum()) != draft_vocab or not bool(t2d[ids].all()):
            problems.append(f"t2d marks {int(t2d.sum())} tokens, not the {draft_vocab} that d2t maps to")
    return problems, "rebuild t2d as the mask of the target ids d2t maps to"
