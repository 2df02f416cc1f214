"""How the next token is chosen: greedy, or sampling from the processed target distribution.

The same `target_probs` serves plain decoding and speculative verification, so both sample from
exactly one distribution (docs/algorithms.md §1: apply the same logits processors before the softmax).
Sampling uses the exponential-race trick (argmax of p / E, E ~ Exp(1)), which needs no host sync
and is CUDA-graph safe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from eaglekit.errors import EaglekitError


@dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy; top_k 0 and top_p 1.0 = off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise EaglekitError(f"bad sampling settings {self}", hint="temperature >= 0, 0 < top_p <= 1, top_k >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


TOPK_CHUNK = 128  # top_k's first pass: the largest of every 128 values


def top_k(x: torch.Tensor, k: int, chunk: int = TOPK_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k) over the last dim (values largest first, their indices), in two passes.

    Why: CUDA's topk runs one block per slice, so on the tree's [K, Vd] draft log-probs (8 slices of
    16k) it was a tree cycle's top kernel on a GPU (docs/notes/engine.md, "Top-k in two passes"). The
    first pass takes the k best of every `chunk` values ([..., V // chunk, chunk]: many small slices),
    the second the k best of those and of the tail (the last V % chunk values). Same values as
    torch.topk; among equal values either index may come first.
    x: [..., V] -> values [..., k], indices [..., k] (int64, into V).
    """
    V = x.shape[-1]
    if k > chunk or V < 2 * chunk:
        return torch.topk(x, k)
    whole = V - V % chunk
    best, local = x[..., :whole].unflatten(-1, (-1, chunk)).topk(k)  # [..., V // chunk, k]
    offsets = torch.arange(0, whole, chunk, device=x.device).unsqueeze(-1)  # [V // chunk, 1]
    tail = torch.arange(whole, V, device=x.device).expand(*x.shape[:-1], V - whole)
    values = torch.cat([best.flatten(-2), x[..., whole:]], -1)  # [..., C]
    indices = torch.cat([(local + offsets).flatten(-2), tail], -1)  # [..., C]
    values, pick = values.topk(k)  # [..., k]
    return values, indices.gather(-1, pick)


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k and top-p."""
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = top_k(logits, min(sampling.top_k, logits.shape[-1]))[0][..., -1:]  # two passes: see top_k
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor) -> torch.Tensor:
    """[..., V] probabilities -> [...] sampled ids (exponential race: no host sync)."""
    race = torch.empty_like(probs).exponential_(1)
    return torch.argmax(probs / race, dim=-1)


def next_token(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[..., V] logits -> [...] the chosen ids (argmax when greedy)."""
    if sampling.greedy:
        return torch.argmax(logits, dim=-1)
    return sample(target_probs(logits, sampling))
