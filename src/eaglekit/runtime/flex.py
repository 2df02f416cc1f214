"""Attention that reads only the cache blocks a row can see (FlexAttention), for batched decoding.

In continuous batching (`data.batch_decoder`) row b sees its slots 0..n_b, and the n_b differ widely: a
dense kernel over all L slots reads every row's whole cache, a block-sparse one reads about
sum(n_b). The block structure is derived from the boolean mask itself (any mask works: a prefix, a
tree), in blocks of `BLOCK` slots: blocks no query sees are skipped, blocks every query sees
whole are read without the mask, the rest apply it element by element.

Only inside torch.compile (Inductor generates the block-sparse kernel); eager runs (prefill, CPU)
compute the same math with SDPA and the dense mask.

Shapes: B batch, h kv heads, R query rows (grouped queries folded in), L slots (a multiple of
BLOCK), d head dim, NB = L / BLOCK.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128  # FlexAttention's default sparse block; L must be a multiple of it


def block_mask_of(mask: torch.Tensor):
    """[B, 1, R, L] bool -> a FlexAttention BlockMask over the same pattern (one query block)."""
    B, _, R, L = mask.shape
    NB = L // BLOCK
    tiles = mask.view(B, R, NB, BLOCK)
    seen = tiles.any(-1).any(1)  # [B, NB] some query sees a slot of the block
    whole = tiles.all(-1).all(1)  # [B, NB] every query sees all of it
    partial = seen & ~whole

    def count(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.sum(-1).to(torch.int32).view(B, 1, 1)

    def listed(blocks: torch.Tensor) -> torch.Tensor:  # the blocks' indices first, in order
        order = torch.argsort(blocks.to(torch.int32), dim=-1, descending=True, stable=True)
        return order.to(torch.int32).view(B, 1, 1, NB)

    def mask_mod(b, h, q_idx, kv_idx):
        return mask[b if B > 1 else 0, 0, q_idx, kv_idx]  # a [1, ...] mask serves every row

    return BlockMask.from_kv_blocks(
        count(partial),
        listed(partial),
        count(whole),
        listed(whole),
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(R, L),
        **NO_Q_BLOCKS,
    )


def _no_q_blocks() -> dict:
    """Skip the transposed block lists (only the backward pass reads them) where this torch can."""
    return (
        {"compute_q_blocks": False}
        if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters
        else {}
    )


NO_Q_BLOCKS = _no_q_blocks()


@dataclass(frozen=True)
class FlexMask:
    """A boolean mask [B, 1, R, L] with its BlockMask, built once for a forward's layers (`flex_mask`):
    built inside each layer, its ~8 small kernels ran once per layer where the layers are compiled
    one by one (`FastTarget.compiled_layers`)."""

    dense: torch.Tensor
    block: object

    @property
    def shape(self) -> torch.Size:
        return self.dense.shape


def flex_mask(mask: torch.Tensor) -> FlexMask:
    return FlexMask(mask, block_mask_of(mask))


def attend_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """q [B, h, R, d], k/v [B, h, L, d], mask [B, 1, R, L] bool or its `FlexMask` -> [B, h, R, d]."""
    dense = mask.dense if isinstance(mask, FlexMask) else mask
    if not torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    block = mask.block if isinstance(mask, FlexMask) else block_mask_of(mask)
    return flex_attention(q, k, v, block_mask=block)
