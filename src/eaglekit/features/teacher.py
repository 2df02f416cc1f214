"""What the loss needs from the target: its next-token distribution, restricted to the draft vocab.

Two forms, one type:

- dense (online): the exact target softmax over the draft vocab, from the full logits;
- sparse (offline): the target's top-k over the *full* vocabulary, stored as target ids (int32)
  and log-probabilities (float16), 6*k bytes a token instead of the 2*H of a final hidden state.
  Because the ids are target ids, one capture serves any draft vocab (a vocab sweep needs no
  re-capture); entries outside the draft vocab are dropped and the rest renormalized, and top-1 is
  the exact target argmax, so the out-of-vocab mask and the accuracy metrics stay exact.

In both forms `argmax` is the target's argmax over its whole vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Teacher:
    """Target distributions at each (batch, position); position t is p_t, which predicts token t+1.

    Attributes:
        argmax: [B, T] int64 target ids, the target's greedy choice over its whole vocabulary.
        probs: [B, T, Vd] (dense) or [B, T, k] (sparse) float32, summing to 1 over the draft vocab
            (all zeros where no top-k entry is in the draft vocab).
        index: None (dense) or [B, T, k] int64 draft ids of `probs` (0 where the entry is padding).
    """

    argmax: torch.Tensor
    probs: torch.Tensor
    index: torch.Tensor | None = None

    def to(self, device) -> "Teacher":
        return Teacher(
            self.argmax.to(device, non_blocking=True),
            self.probs.to(device, non_blocking=True),
            None if self.index is None else self.index.to(device, non_blocking=True),
        )

    def at(self, rows: torch.Tensor, positions: torch.Tensor) -> "Teacher":
        """The distributions at (rows[i], positions[i]), as one row [1, N, ...] (contiguous copies)."""
        return Teacher(
            self.argmax[rows, positions][None],
            self.probs[rows, positions][None],
            None if self.index is None else self.index[rows, positions][None],
        )

    def cross_entropy(self, log_q: torch.Tensor) -> torch.Tensor:
        """Soft cross-entropy -sum_v p(v) log q(v) per position.

        Args:
            log_q: [B, T, Vd] draft log-probabilities (float32).

        Returns:
            [B, T] float32.
        """
        if self.index is None:
            return -(self.probs * log_q).sum(-1)
        return -(self.probs * log_q.gather(-1, self.index)).sum(-1)

    def acceptance(self, q: torch.Tensor) -> torch.Tensor:
        """Acceptance rate sum_v min(p(v), q(v)) = 1 - TV(p, q) per position: the chance that speculative
        sampling accepts a token drawn from q. Sparse: the sum over the k ids is exact (p is zero
        elsewhere; an out-of-vocab entry has p = 0 and adds nothing; sequence padding rows are
        never trained).

        Args:
            q: [B, T, Vd] draft probabilities (float32).

        Returns:
            [B, T] float32.
        """
        if self.index is None:
            return torch.minimum(self.probs, q).sum(-1)
        return torch.minimum(self.probs, q.gather(-1, self.index)).sum(-1)


def dense_teacher(logits: torch.Tensor, draft_ids: torch.Tensor) -> Teacher:
    """The exact teacher from full target logits.

    Args:
        logits: [B, T, V] target logits (any float dtype).
        draft_ids: [Vd] int64 target ids of the draft vocab, on the logits' device.
    """
    argmax = logits.argmax(-1)  # [B, T]
    # softmax(dtype=) upcasts inside the kernel: no fp32 copy of the [B, T, Vd] logits beside the result.
    probs = logits.index_select(-1, draft_ids).softmax(-1, dtype=torch.float32)  # [B, T, Vd]
    return Teacher(argmax=argmax, probs=probs)


@torch.no_grad()
def topk_from_logits(logits: torch.Tensor, k: int, *, chunk_tokens: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the target's log-softmax over its full vocabulary, computed in token chunks.

    Args:
        logits: [N, V] target logits.
        k: entries kept per token.

    Returns:
        ids [N, k] int32 target ids (descending probability; ids[:, 0] is the argmax) and
        logp [N, k] float16 log-probabilities.
    """
    ids, logp = [], []
    for start in range(0, logits.shape[0], chunk_tokens):
        part = logits[start : start + chunk_tokens].float()
        lse = part.logsumexp(-1, keepdim=True)
        values, index = part.topk(k, dim=-1)  # sorted, largest first
        ids.append(index.to(torch.int32))
        logp.append((values - lse).clamp(min=-60000.0).to(torch.float16))
    return torch.cat(ids), torch.cat(logp)


def sparse_teacher(topk_ids: torch.Tensor, topk_logp: torch.Tensor, target_to_draft: torch.Tensor) -> Teacher:
    """The teacher from a stored top-k, restricted to the draft vocab and renormalized.

    Args:
        topk_ids: [B, T, k] target ids (int32/int64), topk_ids[..., 0] the target argmax.
        topk_logp: [B, T, k] log-probabilities.
        target_to_draft: [V] int64, -1 for ids outside the draft vocab (`DraftVocab.target_to_draft`).
    """
    ids = topk_ids.long()
    draft = target_to_draft[ids]  # [B, T, k], -1 outside
    inside = draft >= 0
    logp = topk_logp.float().masked_fill(~inside, float("-inf"))
    probs = torch.where(inside.any(-1, keepdim=True), logp.softmax(-1), torch.zeros_like(logp))
    probs = probs.nan_to_num(0.0)
    return Teacher(argmax=ids[..., 0], probs=probs, index=draft.clamp(min=0))
