"""One training batch, as both feature sources (offline store, online target) deliver it.

Rows are right-padded: a padded position has loss_mask 0 and, under causal attention, is never
seen by a real one, so no attention mask is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglekit.features.teacher import Teacher


@dataclass
class Batch:
    """Raw (unshifted) token positions; the TTT unroll does the shifting.

    Attributes:
        input_ids: [B, T] int64 token ids (0 in padding).
        loss_mask: [B, T] bool, True where the assistant wrote the token.
        aux: [B, T, k*Ht] the target's concatenated aux states.
        teacher: the target's distribution p_t at each position t.
        lengths: [B] int64 real lengths.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    teacher: Teacher
    lengths: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device, non_blocking=True), self.loss_mask.to(device, non_blocking=True),
                     self.aux.to(device, non_blocking=True), self.teacher.to(device),
                     self.lengths.to(device, non_blocking=True))


def pad_stack(rows: list[torch.Tensor], length: int, value=0) -> torch.Tensor:
    """Stack [T_i, ...] tensors into [B, length, ...], right-padded with `value`."""
    out = rows[0].new_full((len(rows), length, *rows[0].shape[1:]), value)
    for i, row in enumerate(rows):
        out[i, :row.shape[0]] = row
    return out
