"""Verification: which drafted tokens the target accepts, and the token it adds (papers.md §3.1, §3.4).

Greedy acceptance runs on the device without a host sync. Sampling is split in two: the device
computes a few numbers per node (the probabilities that decide acceptance, and one token sampled in
advance from each node's residual distribution); the host then walks the tree with its own random
numbers. Both give `(count, path, bonus)`:

    count: number of accepted drafts a (tau contribution a + 1)
    path:  node indices root-first, [0, i_1 .. i_a], padded with i_a to max_depth + 1 entries
    bonus: the token the target adds after the accepted path (correction or bonus)

Shapes: N tree nodes, V target vocabulary, k chain drafts, D max depth.
"""

from __future__ import annotations

import random

import torch

from eaglekit.engine.sampling import sample
from eaglekit.engine.tree import Tree


# ---- greedy (T = 0) ---------------------------------------------------------------------------

def greedy_accept(tree: Tree, target_argmax: torch.Tensor, max_depth: int):
    """Deepest node whose whole root path matches the target's argmax; ties go to the first node.

    Args:
        tree: the verified tree.
        target_argmax: [N] argmax of the target logits at every node (predicts that node's child).
        max_depth: D, the deepest possible node.

    Returns:
        count [1], path [D + 1], bonus [1] (device tensors).
    """
    N = tree.size
    match = tree.tokens == target_argmax[tree.parents.clamp(min=0)]       # [N]
    match[0] = True                                                        # the root is committed
    ok = ~(tree.anc & ~match.unsqueeze(0)).any(1)                          # [N] whole path matches
    # 1-element index tensors, never 0-d ones: those index like Python ints (a host sync).
    best = torch.argmax(torch.where(ok, tree.depth, -1)).view(1)           # first of the deepest
    # path[d] = the ancestor of `best` at depth d; deeper slots repeat `best`.
    on_path = tree.anc.index_select(0, best)[0]                            # [N]
    depth_of = torch.where(on_path, tree.depth, max_depth + 1)             # off-path -> dump slot
    path = best.repeat(max_depth + 2)
    path = path.scatter(0, depth_of, torch.arange(N, device=path.device))[: max_depth + 1]
    return tree.depth[best], path, target_argmax[best]


# ---- sampling on a tree with deterministic children (q one-hot) -------------------------------

def tree_sampling_tables(tree: Tree, probs: torch.Tensor):
    """Device half of tree verification at T > 0 (papers.md §3.4, EAGLE-2/3 official rule).

    Args:
        tree: the verified tree (children of a node carry distinct tokens).
        probs: [N, V] processed target distribution at every node.

    Returns:
        p_node [N]: p_parent(node)(node token), the chance the node is accepted given its parent
            (before earlier siblings are rejected); 1 for the root.
        residual [N]: a token sampled from the node's distribution with all its children's tokens
            removed. It is emitted when every child is rejected, or when the node is a leaf.
    """
    parent = tree.parents.clamp(min=0)
    is_child = tree.parents >= 0
    p_node = torch.where(is_child, probs[parent, tree.tokens], torch.ones_like(probs[:, 0]))
    residual = probs.masked_fill(_children_of(tree, probs.shape[1]), 0)
    empty = residual.sum(-1, keepdim=True) <= 0                            # float rounding only
    residual = torch.where(empty, probs, residual)
    return p_node, sample(residual)


def _children_of(tree: Tree, vocab: int) -> torch.Tensor:
    """[N, V] bool: row j marks the tokens of node j's children."""
    N = tree.size
    removed = torch.zeros(N, vocab, dtype=torch.bool, device=tree.tokens.device)
    rows = torch.where(tree.parents >= 0, tree.parents, N)                # root -> a dump row
    pad = torch.zeros(1, vocab, dtype=torch.bool, device=tree.tokens.device)
    removed = torch.cat([removed, pad]).index_put((rows, tree.tokens), torch.ones_like(rows, dtype=torch.bool))
    return removed[:N]


def walk_tree_sampling(parents: list[int], p_node: list[float], residual: list[int],
                       rng: random.Random, max_depth: int) -> tuple[int, list[int], int]:
    """Host half: from the root, try each child in order; accept it with probability p / (mass left).

    Rejecting child x sets p(x) = 0 and renormalizes, so the next sibling y is accepted with
    p(y) / (1 - p(x) - ...). When every child is rejected (or the node is a leaf) the emitted token
    is the node's presampled residual token. This keeps the target distribution exactly.

    Returns:
        count, path (padded to max_depth + 1), bonus.
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(i)
    cur, path = 0, [0]
    while True:
        left = 1.0
        for child in children.get(cur, []):
            if left > 0 and rng.random() * left < p_node[child]:
                cur = child
                path.append(child)
                break
            left -= p_node[child]
        else:
            break
    count = len(path) - 1
    return count, path + [path[-1]] * (max_depth + 1 - len(path)), residual[cur]


# ---- sampling on a chain with the full draft distribution q ----------------------------------

def chain_sampling_tables(tokens: torch.Tensor, probs: torch.Tensor, q: torch.Tensor):
    """Device half of chain speculative sampling (papers.md §3.1).

    Args:
        tokens: [k + 1] root then drafts d_1..d_k.
        probs: [k + 1, V] processed target distribution at every chain node.
        q: [k, V] the draft distribution each d_i was sampled from, in target ids.

    Returns:
        ratio [k]: p_i(d_i) / q_i(d_i); residual [k]: a token from norm(max(0, p_i - q_i));
        bonus [1]: a token from p_{k+1}.
    """
    k = q.shape[0]
    drafts = tokens[1:].unsqueeze(1)                                      # [k, 1]
    p_d = probs[:k].gather(1, drafts).squeeze(1)
    q_d = q.gather(1, drafts).squeeze(1)
    ratio = p_d / q_d.clamp(min=1e-30)
    left = (probs[:k] - q).clamp(min=0)
    left = torch.where(left.sum(-1, keepdim=True) <= 0, probs[:k], left)  # p == q: never used
    return ratio, sample(left), sample(probs[k:])


def walk_chain_sampling(ratio: list[float], residual: list[int], bonus: int,
                        rng: random.Random) -> tuple[int, list[int], int]:
    """Host half: accept d_i with probability min(1, p/q); on rejection emit the residual token."""
    k = len(ratio)
    for i, r in enumerate(ratio):
        if rng.random() >= r:
            return i, list(range(i + 1)) + [i] * (k - i), residual[i]
    return k, list(range(k + 1)), bonus
