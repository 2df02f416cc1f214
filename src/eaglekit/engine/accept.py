"""Verification: which drafted tokens the target accepts, and the token it adds (docs/algorithms.md §1, §4).

`accept` is the one entry point: greedy, a sampled chain, or a tree (or a chain of deterministic
drafts) at T > 0; the rules follow it. Every rule runs on the device without a host sync, at fixed
shapes, so it lives inside the engine's captured cycle. Sampling is two steps: a few numbers per
node (the probabilities that decide acceptance, and one token sampled in advance from each node's
residual distribution), then the walk down the tree with one uniform draw per node. All give
`(count, path, bonus)`:

    count: number of accepted drafts a (tau contribution a + 1)
    path:  node indices root-first, [0, i_1 .. i_a], padded with i_a to max_depth + 1 entries
    bonus: the token the target adds after the accepted path (correction or bonus)

Shapes: N tree nodes, V target vocabulary, k chain drafts, D max depth.
"""

from __future__ import annotations

import torch

from eaglekit.engine.tree import Tree
from eaglekit.runtime.sampling import Sampling, sample, target_probs


def accept(tree: Tree, logits: torch.Tensor, sampling: Sampling, max_depth: int, q: torch.Tensor | None = None):
    """Which drafts of the verified tree the target accepts, and the token it adds.

    greedy (T = 0): the deepest node whose whole path is the target's argmax. T > 0 with `q`: a
    chain sampled from the draft's full distribution, each draft accepted with min(1, p/q). T > 0
    without it: a tree, or a chain of deterministic drafts (q one-hot), walked from the root.

    Args:
        tree: the verified tree (a chain is a path).
        logits: [N, V] the target's logits at every node (each predicts that node's child).
        sampling: the settings plain decoding samples with, so both sample one distribution.
        max_depth: D, the deepest possible node.
        q: [k, V] the draft distribution each chain draft was sampled from, in target ids.

    Returns:
        count [1], path [D + 1], bonus [1] (device tensors).
    """
    if sampling.greedy:
        return greedy_accept(tree, torch.argmax(logits, -1), max_depth)
    probs = target_probs(logits, sampling)  # [N, V]
    if q is not None:
        ratio, residual, bonus = chain_sampling_tables(tree.tokens, probs, q)
        uniform = torch.rand(q.shape[0], device=logits.device, dtype=torch.float64)
        return chain_sampling_accept(ratio, residual, bonus, uniform)
    p_node, residual = tree_sampling_tables(tree, probs)
    uniform = torch.rand(tree.size, device=logits.device, dtype=torch.float64)
    return tree_sampling_accept(tree, p_node, residual, uniform, max_depth)


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
    match = tree.tokens == target_argmax[tree.parents.clamp(min=0)]  # [N]
    # The root is committed. fill_ on a 1-element slice, not `match[0] = True`: that copies a CPU
    # scalar tensor into the device tensor, which a CUDA graph capture refuses (uncompiled cycle).
    match[:1].fill_(True)
    ok = ~(tree.anc & ~match.unsqueeze(0)).any(1)  # [N] whole path matches
    # 1-element index tensors, never 0-d ones: those index like Python ints (a host sync).
    best = torch.argmax(torch.where(ok, tree.depth, -1)).view(1)  # first of the deepest
    # path[d] = the ancestor of `best` at depth d; deeper slots repeat `best`.
    on_path = tree.anc.index_select(0, best)[0]  # [N]
    depth_of = torch.where(on_path, tree.depth, max_depth + 1)  # off-path -> dump slot
    path = best.repeat(max_depth + 2)
    path = path.scatter(0, depth_of, torch.arange(N, device=path.device))[: max_depth + 1]
    return tree.depth[best], path, target_argmax[best]


# ---- sampling on a tree with deterministic children (q one-hot) -------------------------------


def tree_sampling_tables(tree: Tree, probs: torch.Tensor):
    """Device half of tree verification at T > 0 (docs/algorithms.md §4, EAGLE-2/3's rule).

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
    empty = residual.sum(-1, keepdim=True) <= 0  # float rounding only
    residual = torch.where(empty, probs, residual)
    return p_node, sample(residual)


def _children_of(tree: Tree, vocab: int) -> torch.Tensor:
    """[N, V] bool: row j marks the tokens of node j's children."""
    N = tree.size
    removed = torch.zeros(N, vocab, dtype=torch.bool, device=tree.tokens.device)
    rows = torch.where(tree.parents >= 0, tree.parents, N)  # root -> a dump row
    pad = torch.zeros(1, vocab, dtype=torch.bool, device=tree.tokens.device)
    removed = torch.cat([removed, pad]).index_put((rows, tree.tokens), torch.ones_like(rows, dtype=torch.bool))
    return removed[:N]


def tree_sampling_accept(
    tree: Tree, p_node: torch.Tensor, residual: torch.Tensor, uniform: torch.Tensor, max_depth: int
):
    """The walk from the root: try each child in order and accept it with probability
    p / (mass left), where the mass left is 1 minus the p of its earlier (rejected) siblings.

    Rejecting child x sets p(x) = 0 and renormalizes, so the next sibling y is accepted with
    p(y) / (1 - p(x) - ...). When every child is rejected (or the node is a leaf) the emitted token
    is the node's presampled residual token. This keeps the target distribution exactly. Each node
    has its own uniform draw, used only if the walk reaches it.

    Args:
        tree: the verified tree.
        p_node, residual: [N] from `tree_sampling_tables`.
        uniform: [N] float64 draws in [0, 1).
        max_depth: D.

    Returns:
        count [1], path [D + 1] (padded with its last node), bonus [1].
    """
    N = tree.size
    idx = torch.arange(N, device=p_node.device)
    p = p_node.double()
    earlier = (tree.parents.unsqueeze(1) == tree.parents.unsqueeze(0)) & (idx.unsqueeze(0) < idx.unsqueeze(1))
    left = 1 - (earlier.double() * p.unsqueeze(0)).sum(1)  # [N] mass left when j is tried
    accept = (left > 0) & (uniform * left < p) & (tree.parents >= 0)
    cur = torch.zeros(1, dtype=torch.long, device=p_node.device)
    alive = torch.ones(1, dtype=torch.bool, device=p_node.device)
    path = [cur]
    for _ in range(max_depth):
        chosen = accept & (tree.parents == cur)  # accepted children of cur
        first = torch.argmax(chosen.int()).view(1)  # the first of them in order
        alive = alive & chosen.any().view(1)
        cur = torch.where(alive, first, cur)
        path.append(cur)
    path = torch.cat(path)
    return tree.depth[cur], path, residual[cur]


# ---- sampling on a chain with the full draft distribution q ----------------------------------


def chain_sampling_tables(tokens: torch.Tensor, probs: torch.Tensor, q: torch.Tensor):
    """Device half of chain speculative sampling (docs/algorithms.md §1).

    Args:
        tokens: [k + 1] root then drafts d_1..d_k.
        probs: [k + 1, V] processed target distribution at every chain node.
        q: [k, V] the draft distribution each d_i was sampled from, in target ids.

    Returns:
        ratio [k]: p_i(d_i) / q_i(d_i); residual [k]: a token from norm(max(0, p_i - q_i));
        bonus [1]: a token from p_{k+1}.
    """
    k = q.shape[0]
    drafts = tokens[1:].unsqueeze(1)  # [k, 1]
    p_d = probs[:k].gather(1, drafts).squeeze(1)
    q_d = q.gather(1, drafts).squeeze(1)
    ratio = p_d / q_d.clamp(min=1e-30)
    left = (probs[:k] - q).clamp(min=0)
    left = torch.where(left.sum(-1, keepdim=True) <= 0, probs[:k], left)  # p == q: never used
    return ratio, sample(left), sample(probs[k:])


def chain_sampling_accept(ratio: torch.Tensor, residual: torch.Tensor, bonus: torch.Tensor, uniform: torch.Tensor):
    """Accept d_i with probability min(1, p/q) until the first rejection, which emits that
    position's residual token; all k accepted emit the bonus token.

    Args:
        ratio, residual [k], bonus [1]: from `chain_sampling_tables`.
        uniform: [k] float64 draws in [0, 1).

    Returns:
        count [1], path [k + 1] (0..count, padded with count), bonus [1].
    """
    k = ratio.shape[0]
    count = torch.cumprod((uniform < ratio.double()).long(), 0).sum().view(1)
    path = torch.arange(k + 1, device=ratio.device).clamp(max=count)
    return count, path, torch.cat([residual, bonus.view(1)])[count]
