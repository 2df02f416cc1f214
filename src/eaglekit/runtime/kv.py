"""Static KV caches the engine controls: writes at explicit slots, rollback by index gather.

Slot s of a cache holds the key/value of the token the engine wrote there; which slots are visible
is decided by the attention mask alone (`cache_mask`), so rejected draft tokens need no
clearing, and compaction is one gather. A write names its slots in one of three forms
(`write_slots`): [T] the same slots in every row (one sequence, or rows in step), [B, T] each row
its own (continuous batching: rows at different lengths), or a `Refill` (new prompts written into
some rows only, the others untouched). Shapes: B batch, h kv heads, L slots, d head dim, T query tokens, R a block's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.runtime.flex import attend_flex


@dataclass(frozen=True)
class Refill:
    """Where the prompts of new sequences go in a batch cache: the tokens of row rows[i] at
    slots[i]. span 0: nothing is cached before them, so the prompts attend only to themselves: the
    write returns the new keys/values, and the mask is over the T new tokens ([R, 1, T, T]). span
    C > 0 (a resumed row: its cache holds the prompt's first tokens): the write returns the rows'
    slots 0..C-1, the new ones included, and the mask is [R, 1, T, C].

    rows:  [R] cache rows (a row given twice must come with the same tokens: graphed refills pad so)
    slots: [R, T] the slot of each token (its position; padding goes to slots the row writes later)
    """

    rows: torch.Tensor
    slots: torch.Tensor
    span: int = 0


def cache_mask(
    block: torch.Tensor, prefix_len: torch.Tensor | int, start: torch.Tensor | int, max_len: int
) -> torch.Tensor:
    """The attention mask of T queries over a cache of `max_len` slots.

    Every query sees the committed prefix [0, prefix_len); beyond it, query t sees slot start + r
    iff block[t, r].

    Args:
        block: [T, R] bool, visibility inside the block of slots [start, start + R).
        prefix_len: committed length (int, or a [1] device tensor inside graphs).
        start: first slot of the block.
        max_len: cache slots L.

    Returns:
        [1, 1, T, L] bool, True = attend.
    """
    T, R = block.shape
    cols = torch.arange(max_len, device=block.device)
    rel = cols - start  # [L] slot offset inside the block
    in_block = (rel >= 0) & (rel < R)
    seen = block[:, rel.clamp(0, R - 1)] & in_block  # [T, L]
    return ((cols < prefix_len) | seen).view(1, 1, T, max_len)


def causal_block(T: int, device=None) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def write_slots(cache: torch.Tensor, slots, new: torch.Tensor) -> torch.Tensor:
    """Store new [B', h, T, d] in cache [B, h, L, d]; return what attention reads.

    slots [T]: the same slots in every row, [B, T]: each row its own (B' = B); both return the
    whole cache. A `Refill`: rows.shape[0] = B' rows of the cache, returns `new` itself (span 0)
    or the rows' first `span` slots.
    """
    if isinstance(slots, Refill):
        R, T = slots.slots.shape
        cache[slots.rows.view(R, 1), :, slots.slots] = new.transpose(1, 2)  # indexed as [R, T, h, d]
        return cache[:, :, : slots.span].index_select(0, slots.rows) if slots.span else new  # [R, h, C|T, d]
    if slots.dim() == 1:
        cache.index_copy_(2, slots, new)
    else:  # an index_put, not scatter_: Inductor's scatter_ on a cache view rewrote the whole cache (two full
        # copies per layer, most of a decode step: docs/notes/engine.md, "The batch decoder's KV write")
        B = new.shape[0]
        rows = torch.arange(B, device=slots.device).view(B, 1)
        cache[rows, :, slots] = new.transpose(1, 2)  # indexed as [B, T, h, d]
    return cache


class KVCache(nn.Module):
    """Keys and values of one attention layer: [B, h, L, d] each, preallocated."""

    def __init__(self, batch_size: int, heads: int, max_len: int, head_dim: int, *, dtype, device):
        super().__init__()
        shape = (batch_size, heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, slots, k: torch.Tensor, v: torch.Tensor):
        """Store k/v [B', h, T, d] at slots ([T], [B, T] or a `Refill`, see `write_slots`); return
        what attention reads: the whole cache (k, v), or the new k/v for a Refill."""
        return write_slots(self.k, slots, k), write_slots(self.v, slots, v)


def move_slots(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """cache [..., L, d]: cache[..., dst, :] = cache[..., src, :] (src [S] is gathered first, so
    overlapping ranges are safe)."""
    dim = cache.dim() - 2
    cache.index_copy_(dim, dst, cache.index_select(dim, src))


def group_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """[B|1, 1, T, L] -> [B|1, 1, groups*T, L]: the mask for `attend`'s folded query rows."""
    return mask.repeat(1, 1, groups, 1) if groups > 1 else mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, kind: str = "sdpa") -> torch.Tensor:
    """Grouped-query attention over a whole cache.

    The query heads that share a kv head are folded into the query length, so the kernel reads
    each cached key once and no repeated copy of the cache is made.

    Args:
        q: [B, nh, T, d] queries (head i uses kv head i // (nh // h)).
        k, v: [B, h, L, d] the cache.
        mask: [B|1, 1, g*T, L] bool, True = attend: `group_mask(mask, nh // h)`; [.., S] with S < L
            attends to the first S slots only.
        kind: one of ATTENTION_KINDS, the same math computed by different kernels (see there).

    Returns:
        [B, nh, T, d].
    """
    B, nh, T, d = q.shape
    h = k.shape[1]
    if mask.shape[-1] < k.shape[-2]:  # a mask over the first S slots only (eager CPU steps): read just those
        k, v = k[:, :, : mask.shape[-1]], v[:, :, : mask.shape[-1]]
    # head kv*g + j, token t -> row j*T + t. Split, then merged: torch 2.11's Inductor cannot read the
    # one-step reshape of the rope's output as a view, and copies it once more before a matmul's bmm.
    q = q.reshape(B, h, nh // h, T, d).reshape(B, h, (nh // h) * T, d)
    if kind == "reduce" and not torch.compiler.is_compiling():
        kind = "matmul"  # unfused, the broadcast form would materialize [B, h, R, L, d]: eager runs (prefill, CPU)
    out = ATTENTION_KINDS[kind](q, k, v, mask)
    return out.reshape(B, nh, T, v.shape[-1])


def attend_sdpa(q, k, v, mask):
    """PyTorch's fused attention (with a boolean mask: the memory-efficient kernel on CUDA)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attend_matmul(q, k, v, mask):
    """Two batched matmuls around a masked softmax in float32: at batch 1 and few query rows the
    fused kernel runs one block per head over all L slots; here Inductor fuses mask + softmax into
    one kernel and the matmuls spread over the slots. q [B, h, R, d], k/v [B, h, L, d] -> [B, h, R, d]."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # [B, h, R, L]
    probs = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)  # finite: no NaN rows
    return torch.matmul(probs.to(v.dtype), v)


def attend_reduce(q, k, v, mask):
    """Broadcast products and sums instead of matmuls: Inductor generates its own reduction kernels
    (fused with the mask and the softmax) where the matmuls would each be a cuBLAS launch. Only
    inside torch.compile (`attend` runs the matmul form eagerly). q [B, h, R, d], k/v [B, h, L, d] -> [B, h, R, d]."""
    scores = (q.unsqueeze(3).float() * k.unsqueeze(2).float()).sum(-1) * q.shape[-1] ** -0.5  # [B, h, R, L]
    probs = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return (probs.unsqueeze(-1) * v.unsqueeze(2).float()).sum(3).to(v.dtype)


# Same math, different kernels; which is fastest depends on the device and the shapes
# (scripts/gpu/bench_engine.py parts a and p measure them side by side). "flex" reads only the
# cache blocks a row can see (`runtime.flex`): batched decoding with rows at different lengths.
ATTENTION_KINDS = {
    "sdpa": attend_sdpa,
    "matmul": attend_matmul,
    "reduce": attend_reduce,
    "flex": attend_flex,
}
