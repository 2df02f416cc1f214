"""Draft trees, flattened: node 0 is the root, every parent precedes its children.

A chain of k drafts is the tree whose node i has parent i-1, so one set of functions serves both.
All functions are pure tensor code with fixed shapes (no host sync), so they run inside CUDA
graphs, and on CPU in tests. docs/algorithms.md §3 (EAGLE-2 dynamic tree) gives the algorithm.

Shapes: N tree nodes, C recorded draft candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tree:
    """A flattened draft tree; node 0 is the root, the last token chosen but not yet in the cache.

    tokens:  [N] target token ids
    parents: [N] parent node index, -1 for the root
    depth:   [N] 0 for the root; the node's position is prefix_len + depth
    anc:     [N, N] bool, anc[i, j] = node j is node i or one of its ancestors (the tree mask)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    anc: torch.Tensor

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[N] parent indices (-1 = none) -> [N, N] bool: row i marks i and all its ancestors.

    Row i = identity_i OR row(parent(i)), iterated `max_depth` times (docs/algorithms.md §3 step 6).
    """
    N = parents.shape[0]
    anc = torch.eye(N, dtype=torch.bool, device=parents.device)
    eye = anc.clone()
    has_parent = (parents >= 0).unsqueeze(1)  # [N, 1]
    up = parents.clamp(min=0)
    for _ in range(max_depth):
        anc = eye | (anc[up] & has_parent)
    return anc


def tree_from_parents(tokens: torch.Tensor, parents: torch.Tensor, max_depth: int) -> Tree:
    """Build a tree from tokens [N] and parents [N] (parents precede children)."""
    anc = ancestors(parents, max_depth)
    depth = anc.sum(1) - 1  # depth = row sum of the mask - 1
    return Tree(tokens=tokens, parents=parents, depth=depth, anc=anc)


def chain_tree(tokens: torch.Tensor) -> Tree:
    """A chain [root, d_1 .. d_k] as a tree: node i's parent is i-1."""
    N = tokens.shape[0]
    idx = torch.arange(N, device=tokens.device)
    return Tree(
        tokens=tokens, parents=idx - 1, depth=idx, anc=torch.ones(N, N, dtype=torch.bool, device=tokens.device).tril()
    )


def select_tree(
    root: torch.Tensor,
    cand_tokens: torch.Tensor,
    cand_parents: torch.Tensor,
    cand_values: torch.Tensor,
    cand_depth: torch.Tensor,
    num_nodes: int,
    max_depth: int,
) -> Tree:
    """EAGLE-2 rerank: keep the `num_nodes - 1` best candidates by value, flatten with the root.

    Args:
        root: [1] the root token.
        cand_tokens: [C] target ids of all recorded candidates, in generation (level-major) order.
        cand_parents: [C] candidate index of each candidate's parent, -1 for children of the root.
        cand_values: [C] cumulative draft log-probability along the path.
        cand_depth: [C] depth of each candidate (1 = child of the root).
        num_nodes: N, root included (docs/algorithms.md §3: total_token counts the root).
        max_depth: deepest candidate depth.

    Values only decrease along a path, and ties go to the earlier (shallower) candidate, so every
    kept node's parent is kept too (docs/algorithms.md §3 step 4).
    """
    C = cand_tokens.shape[0]
    order = torch.arange(C, device=cand_tokens.device)
    key = cand_values.double() - order.double() * 1e-9  # tie -> earlier candidate first
    kept = torch.topk(key, num_nodes - 1).indices.sort().values  # [N-1] generation order
    slot = torch.full((C,), -1, dtype=torch.long, device=cand_tokens.device)
    slot[kept] = torch.arange(1, num_nodes, device=cand_tokens.device)  # flattened index, root = 0
    kept_parent = cand_parents[kept]
    parents = torch.where(kept_parent >= 0, slot[kept_parent.clamp(min=0)], 0)
    tokens = torch.cat([root.view(1), cand_tokens[kept]])
    parents = torch.cat([parents.new_full((1,), -1), parents])
    depth = torch.cat([cand_depth.new_zeros(1), cand_depth[kept]])
    return Tree(tokens=tokens, parents=parents, depth=depth, anc=ancestors(parents, max_depth))
