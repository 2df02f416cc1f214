"""Deterministic batch order: a pure function of (seed, lengths, settings), so resume needs only the step.

Every epoch shuffles the samples with its own seeded generator, groups similar lengths into
micro-batches under a token budget (little padding), and shuffles the micro-batches. Epochs are
concatenated into one stream; optimizer step s consumes stream entries [s*G, (s+1)*G) with
G = world_size x grad_accum, and rank r takes entries r*grad_accum ... of them, so one process
with grad_accum=2 sees exactly the batches of two DDP ranks with grad_accum=1.
"""

from __future__ import annotations

import math

import torch

from eaglekit.features.batch import pack_by_tokens

POOL = 256  # samples sorted together by length (bounded so the order stays random)


def epoch_batches(
    lengths: list[int], *, batch_tokens: int, max_batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """Micro-batches (sample indices) of one epoch; rows x longest length <= batch_tokens."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    batches: list[list[int]] = []
    for start in range(0, len(perm), POOL):
        batches += pack_by_tokens(
            perm[start : start + POOL], lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size
        )
    order = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in order]


class BatchPlan:
    """The stream of training micro-batches.

    Args:
        lengths: sample lengths.
        batch_tokens: token budget of one micro-batch (rows x padded length).
        max_batch_size: rows per micro-batch at most.
        seed: data-order seed.
        world_size, grad_accum: micro-batches per optimizer step = world_size x grad_accum.
    """

    def __init__(
        self,
        lengths: list[int],
        *,
        batch_tokens: int,
        max_batch_size: int,
        seed: int,
        world_size: int = 1,
        grad_accum: int = 1,
    ):
        self.lengths = list(lengths)
        self.kwargs = dict(batch_tokens=batch_tokens, max_batch_size=max_batch_size, seed=seed)
        self.world_size, self.grad_accum = world_size, grad_accum
        self._epochs: dict[int, list[list[int]]] = {}
        self._counts: dict[int, int] = {}  # batches per epoch, kept for every epoch seen

    @property
    def per_step(self) -> int:
        return self.world_size * self.grad_accum

    def epoch(self, e: int) -> list[list[int]]:
        if e not in self._epochs:
            self._epochs = {k: v for k, v in self._epochs.items() if k >= e - 1}  # keep memory flat
            self._epochs[e] = epoch_batches(self.lengths, epoch=e, **self.kwargs)
            self._counts[e] = len(self._epochs[e])
        return self._epochs[e]

    def count(self, e: int) -> int:
        return self._counts[e] if e in self._counts else len(self.epoch(e))

    def steps_per_epoch(self) -> float:
        return len(self.epoch(0)) / self.per_step

    def total_steps(self, epochs: float) -> int:
        return max(1, math.ceil(epochs * self.steps_per_epoch()))

    def entry(self, m: int) -> tuple[int, list[int]]:
        """(epoch, sample indices) of stream entry m."""
        e = 0
        while m >= self.count(e):
            m -= self.count(e)
            e += 1
        return e, self.epoch(e)[m]

    def micro_batches(self, step: int, rank: int = 0) -> tuple[int, list[list[int]]]:
        """(epoch, this rank's micro-batches) of optimizer step `step`."""
        first = step * self.per_step + rank * self.grad_accum
        entries = [self.entry(first + i) for i in range(self.grad_accum)]
        return entries[0][0], [b for _, b in entries]


def eval_batches(lengths: list[int], *, batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Fixed validation micro-batches, longest first."""
    return pack_by_tokens(range(len(lengths)), lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
