"""One training batch, as both feature sources (offline store, online target) deliver it, and how
samples are grouped into batches under a token budget (capture and training both use `pack_by_tokens`).

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
        host_loss_mask: loss_mask on the host where the source built it there: what the loss needs
            to index with (`ttt_positions`) without waiting for the device.
    """

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    teacher: Teacher
    lengths: torch.Tensor
    host_loss_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def to(self, device) -> "Batch":
        return Batch(
            self.input_ids.to(device, non_blocking=True),
            self.loss_mask.to(device, non_blocking=True),
            self.aux.to(device, non_blocking=True),
            self.teacher.to(device),
            self.lengths.to(device, non_blocking=True),
            self.host_loss_mask,
        )


def pad_stack(rows: list[torch.Tensor], length: int, value=0) -> torch.Tensor:
    """Stack [T_i, ...] tensors into [B, length, ...], right-padded with `value`."""
    out = rows[0].new_full((len(rows), length, *rows[0].shape[1:]), value)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def pack_by_tokens(
    indices, lengths: list[int], *, batch_tokens: int, max_batch_size: int | None = None
) -> list[list[int]]:
    """Group `indices`, longest first (ties by index), so that rows x longest length <= batch_tokens.

    Padding stays bounded because a group's rows are of similar length. A sample longer than
    `batch_tokens` gets a group of its own; `max_batch_size` also caps the rows of a group.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        longest = lengths[current[0]] if current else lengths[i]
        if current and (
            (len(current) + 1) * longest > batch_tokens
            or (max_batch_size is not None and len(current) >= max_batch_size)
        ):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def counted_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] raw mask -> [B, T] mask of raw positions s whose prediction counts (x_s and x_{s+1} assistant).
    The one rule: training's loss and stats, the baselines, and tokenization's drop of conversations
    with nothing to learn from."""
    nxt = torch.nn.functional.pad(loss_mask[:, 1:], (0, 1), value=False)
    return loss_mask & nxt
