"""Pure engine parts on hand-built inputs: tree masks and positions, EAGLE-2 rerank, greedy
acceptance, cache masks, and statistical tests that sampling verification is lossless."""

import functools

import pytest
import torch

from eaglekit.engine.accept import (
    accept,
    chain_sampling_accept,
    chain_sampling_tables,
    greedy_accept,
    tree_sampling_accept,
    tree_sampling_tables,
)
from eaglekit.engine.spec import SpecConfig
from eaglekit.engine.tree import chain_tree, select_tree, tree_from_parents
from eaglekit.errors import EaglekitError
from eaglekit.runtime.kv import cache_mask
from eaglekit.runtime.sampling import Sampling, target_probs, top_k
from engine_tiny import chi_square_pvalue, one_thread  # noqa: F401 (fixture)

#        0 (root)
#      /  |   \
#     1   2    3
#    / \   \
#   4   5   6
#   |
#   7
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4]


def test_tree_mask_and_depth_on_a_hand_built_tree():
    tree = tree_from_parents(torch.arange(10, 18), torch.tensor(PARENTS), max_depth=3)
    assert tree.depth.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    expected = {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 3], 4: [0, 1, 4], 5: [0, 1, 5], 6: [0, 2, 6], 7: [0, 1, 4, 7]}
    for i, seen in expected.items():
        assert torch.nonzero(tree.anc[i]).flatten().tolist() == seen
    # positions = prefix_len + depth; the mask sees the prefix, then the tree block
    mask = cache_mask(tree.anc, 5, 5, 16)[0, 0]
    assert mask.shape == (8, 16)
    assert mask[:, :5].all() and not mask[:, 13:].any()
    assert torch.equal(mask[:, 5:13], tree.anc)


def test_chain_is_a_path_tree():
    chain = chain_tree(torch.tensor([7, 8, 9, 10]))
    same = tree_from_parents(chain.tokens, chain.parents, 3)
    assert torch.equal(chain.anc, same.anc) and torch.equal(chain.depth, same.depth)


def test_cache_mask_tensor_offsets_match_int_offsets():
    block = torch.ones(3, 3, dtype=torch.bool).tril()
    a = cache_mask(block, 4, 4, 12)
    b = cache_mask(block, torch.tensor([4]), torch.tensor([4]), 12)
    assert torch.equal(a, b)
    assert a[0, 0, 2].tolist() == [True] * 7 + [False] * 5


def test_select_tree_keeps_best_values_connected_and_in_generation_order():
    # Candidates, level-major: 3 children of the root, then 2 children each of candidates 0 and 1.
    tokens = torch.tensor([50, 51, 52, 60, 61, 62, 63])
    parents = torch.tensor([-1, -1, -1, 0, 0, 1, 1])
    values = torch.tensor([-0.1, -1.0, -3.0, -0.2, -2.5, -1.1, -1.2])
    depth = torch.tensor([1, 1, 1, 2, 2, 2, 2])
    tree = select_tree(torch.tensor([9]), tokens, parents, values, depth, num_nodes=5, max_depth=2)
    # best 4: cand 0 (-0.1), 3 (-0.2), 1 (-1.0), 5 (-1.1); order by candidate index: 0, 1, 3, 5
    assert tree.tokens.tolist() == [9, 50, 51, 60, 62]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2]
    assert tree.depth.tolist() == [0, 1, 1, 2, 2]


def test_select_tree_tie_keeps_the_parent():
    # A child whose log-prob rounds to 0 ties its parent: the parent must win the tie.
    tokens = torch.tensor([50, 51, 60])
    parents = torch.tensor([-1, -1, 0])
    values = torch.tensor([-0.5, -0.7, -0.5])
    tree = select_tree(torch.tensor([9]), tokens, parents, values, torch.tensor([1, 1, 2]), num_nodes=3, max_depth=2)
    assert tree.tokens.tolist() == [9, 50, 60] and tree.parents.tolist() == [-1, 0, 1]


@pytest.mark.parametrize("shape", [(16384,), (8, 16384), (3, 1000), (2, 5, 300), (200,)])
def test_top_k_matches_torch_topk(shape):
    """The two-pass top-k: torch.topk's values, largest first, indices that hold them (padding never picked)."""
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).log_softmax(-1)
    x[..., 7] = x.max() + 1  # a clear winner in the first chunk
    for k in (1, 8, 10):
        values, indices = top_k(x, k)
        expected = torch.topk(x, k)
        assert torch.equal(values, expected.values)
        assert torch.equal(x.gather(-1, indices), values) and int(indices.max()) < shape[-1]
        assert bool((indices[..., 0] == 7).all())
    x = torch.zeros(8, 512)  # all ties: k distinct real indices per row
    values, indices = top_k(x, 8)
    assert torch.equal(values, torch.zeros(8, 8)) and all(len(set(r.tolist())) == 8 for r in indices)
    x = torch.full((300,), float("-inf"))  # fewer finite values than k: indices stay in V
    x[[5, 150, 299]] = torch.tensor([1.0, 3.0, 2.0])
    values, indices = top_k(x, 8)
    assert indices[:3].tolist() == [150, 299, 5] and int(indices.max()) < 300


def test_greedy_accept_picks_the_deepest_matching_path():
    tree = tree_from_parents(torch.tensor([0, 11, 12, 13, 14, 15, 16, 17]), torch.tensor(PARENTS), 3)
    # target argmax at each node (predicts that node's child)
    argmax = torch.tensor([11, 14, 16, 0, 99, 0, 0, 0])  # root->1 ok, 1->4 ok, 4->(99) != 7
    count, path, bonus = greedy_accept(tree, argmax, max_depth=3)
    assert count.tolist() == [2] and path.tolist() == [0, 1, 4, 4] and bonus.tolist() == [99]
    argmax = torch.tensor([12, 0, 16, 0, 0, 0, 5, 0])  # root->2, 2->6, bonus from node 6
    count, path, bonus = greedy_accept(tree, argmax, max_depth=3)
    assert count.tolist() == [2] and path.tolist() == [0, 2, 6, 6] and bonus.tolist() == [5]
    argmax = torch.tensor([40, 0, 0, 0, 0, 0, 0, 0])  # nothing matches
    count, path, bonus = greedy_accept(tree, argmax, max_depth=3)
    assert count.tolist() == [0] and path.tolist() == [0, 0, 0, 0] and bonus.tolist() == [40]
    argmax = torch.tensor([11, 14, 0, 0, 17, 0, 0, 3])  # the whole deepest path
    count, path, bonus = greedy_accept(tree, argmax, max_depth=3)
    assert count.tolist() == [3] and path.tolist() == [0, 1, 4, 7] and bonus.tolist() == [3]


def test_accept_is_the_one_entry_for_greedy_a_sampled_chain_and_a_tree():
    """`accept` picks the rule (greedy; T > 0 with the chain's q; T > 0 as a tree) and draws what that
    rule drew inline in the engine, in the same order: the tables' samples, then the uniforms."""
    tree = tree_from_parents(torch.tensor([0, 11, 12, 13, 14, 15, 16, 17]), torch.tensor(PARENTS), 3)
    logits = torch.randn(8, 20, generator=torch.Generator().manual_seed(0)) * 3
    greedy = [x.tolist() for x in accept(tree, logits, Sampling(), 3)]
    assert greedy == [x.tolist() for x in greedy_accept(tree, logits.argmax(-1), 3)]
    sampling = Sampling(temperature=0.9)
    torch.manual_seed(5)
    got = [x.tolist() for x in accept(tree, logits, sampling, 3)]
    torch.manual_seed(5)
    p_node, residual = tree_sampling_tables(tree, target_probs(logits, sampling))
    want = tree_sampling_accept(tree, p_node, residual, torch.rand(8, dtype=torch.float64), 3)
    assert got == [x.tolist() for x in want]
    chain = chain_tree(torch.tensor([0, 3, 4, 5]))
    q = torch.softmax(torch.randn(3, 20, generator=torch.Generator().manual_seed(1)), -1)
    torch.manual_seed(6)
    got = [x.tolist() for x in accept(chain, logits[:4], sampling, 3, q=q)]
    torch.manual_seed(6)
    tables = chain_sampling_tables(chain.tokens, target_probs(logits[:4], sampling), q)
    want = chain_sampling_accept(*tables, torch.rand(3, dtype=torch.float64))
    assert got == [x.tolist() for x in want]


def test_target_probs_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = target_probs(logits, Sampling(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and torch.allclose(p.sum(), torch.tensor(1.0))
    full = logits.softmax(-1)[0]
    p = target_probs(logits, Sampling(temperature=1.0, top_p=float(full[0] + 0.01)))
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()  # smallest set reaching top_p
    with pytest.raises(EaglekitError):
        Sampling(temperature=-1)


def test_spec_config_shapes():
    tree = SpecConfig(mode="tree", depth=6, top_k=10, total_tokens=60)
    assert tree.num_nodes == 60 and tree.max_depth == 6 and tree.num_candidates == 10 + 5 * 100
    assert SpecConfig(mode="tree", depth=2, top_k=2, total_tokens=60).num_nodes == 1 + 2 + 4
    assert SpecConfig(mode="chain", k=4).num_nodes == 5
    with pytest.raises(EaglekitError):
        SpecConfig(mode="beam")


# ---- lossless sampling: chi-square on a toy target and toy draft ------------------------------

V = 4  # toy vocabulary
LENGTH = 3  # tokens compared jointly (V**LENGTH cells)


def toy(context: tuple, salt: int, scale: float) -> torch.Tensor:
    """A fixed distribution over V tokens for every context (seeded by the context)."""
    g = torch.Generator().manual_seed(hash((salt,) + context) % (2**31))
    return (torch.randn(V, generator=g, dtype=torch.float64) * scale).softmax(-1)


def p_target(context):
    return toy(context, 1, 1.2)


def q_draft(context):
    return toy(context, 2, 1.5)


def exact_joint() -> torch.Tensor:
    """P(first LENGTH tokens) under the target, [V ** LENGTH]."""
    probs = torch.zeros(V**LENGTH, dtype=torch.float64)
    for cell in range(V**LENGTH):
        seq = [(cell // V ** (LENGTH - 1 - i)) % V for i in range(LENGTH)]
        prob = 1.0
        for i, tok in enumerate(seq):
            prob *= float(p_target(tuple(seq[:i]))[tok])
        probs[cell] = prob
    return probs


# Tree with siblings at several levels and a path of depth 3 (parents precede children):
# root -> 3 children (q's top-3); child 1 -> 2 children; its first -> 2 children; child 2 -> 1.
SHAPE = [(-1, 0), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (4, 0), (4, 1)]  # (parent, rank in q)


def toy_tree(context: tuple):
    """Tokens by the draft's ranking at each node's context; returns the tree and per-node contexts."""
    tokens, contexts = [], []
    for parent, rank in SHAPE:
        if parent < 0:
            tokens.append(context[-1] if context else 0)
            contexts.append(context)
            continue
        ctx = contexts[parent]
        tok = int(torch.argsort(q_draft(ctx), descending=True)[rank])
        tokens.append(tok)
        contexts.append(ctx + (tok,))
    tree = tree_from_parents(torch.tensor(tokens), torch.tensor([p for p, _ in SHAPE]), 3)
    return tree, contexts


def run_tree_trials(trials: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    counts = torch.zeros(V**LENGTH, dtype=torch.float64)
    for _ in range(trials):
        context: tuple = ()
        while len(context) < LENGTH:
            tree, contexts = toy_tree(context)
            probs = torch.stack([p_target(c) for c in contexts]).float()
            p_node, residual = tree_sampling_tables(tree, probs)
            uniform = torch.rand(tree.size, dtype=torch.float64)
            count, path, bonus = tree_sampling_accept(tree, p_node, residual, uniform, 3)
            count, path, bonus = int(count), path.tolist(), int(bonus)
            assert all(tree.parents[path[i + 1]] == path[i] for i in range(count))
            assert path[count + 1 :] == [path[count]] * (3 - count)  # padded with the last node
            context = context + tuple(tree.tokens[path[1 : count + 1]].tolist()) + (bonus,)
        counts[sum(t * V ** (LENGTH - 1 - i) for i, t in enumerate(context[:LENGTH]))] += 1
    return counts


def run_chain_trials(trials: int, seed: int, k: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V**LENGTH, dtype=torch.float64)
    for _ in range(trials):
        context: tuple = ()
        while len(context) < LENGTH:
            drafts, qs, ctx = [], [], context
            for _ in range(k):
                q = q_draft(ctx)
                tok = int(torch.multinomial(q, 1, generator=gen))
                drafts.append(tok)
                qs.append(q)
                ctx = ctx + (tok,)
            tokens = torch.tensor([0] + drafts)
            probs = torch.stack([p_target(context + tuple(drafts[:i])) for i in range(k + 1)]).float()
            ratio, residual, bonus = chain_sampling_tables(tokens, probs, torch.stack(qs).float())
            count, path, out = chain_sampling_accept(ratio, residual, bonus, torch.rand(k, dtype=torch.float64))
            count, path, out = int(count), path.tolist(), int(out)
            assert path == list(range(count + 1)) + [count] * (k - count)
            context = context + tuple(drafts[:count]) + (out,)
        counts[sum(t * V ** (LENGTH - 1 - i) for i, t in enumerate(context[:LENGTH]))] += 1
    return counts


@pytest.mark.parametrize("kind", ["tree", "chain"])
def test_sampling_verification_keeps_the_target_distribution(kind):
    counts = run_tree_trials(3000, seed=0) if kind == "tree" else run_chain_trials(3000, seed=0)
    exact = exact_joint()
    assert chi_square_pvalue(counts, exact) > 1e-3
    # The test has power: the draft's own distribution is rejected by the same statistic.
    draft_joint = torch.zeros_like(exact)
    for cell in range(V**LENGTH):
        seq = [(cell // V ** (LENGTH - 1 - i)) % V for i in range(LENGTH)]
        draft_joint[cell] = torch.tensor([float(q_draft(tuple(seq[:i]))[t]) for i, t in enumerate(seq)]).prod()
    assert chi_square_pvalue(counts, draft_joint) < 1e-6


def test_fused_draft_projections_and_top_logp_compute_the_unfused_math():
    """DraftRunner's inference forms: q/k/v and gate/up as one matmul each (`Eagle3Draft.fused_weights`),
    the output projection by heads, and the tree's top-k of log-probs as top-k of the logits less their
    logsumexp."""
    from eaglekit.engine.draft_runner import top_logp
    from eaglekit.runtime.kernels import output_projection
    from engine_tiny import peaked_model, random_draft

    draft = random_draft(peaked_model("llama"))
    wqkv, w13 = draft.fused_weights()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (1, 5), generator=g)
    hidden = torch.randn(1, 5, draft.config.hidden_size, generator=g)
    pos = torch.arange(5)[None]
    plain, fused = draft.attention_pieces(ids, hidden, pos), draft.attention_pieces(ids, hidden, pos, wqkv=wqkv)
    for a, b in zip(plain, fused):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)
    out = torch.randn(1, draft.config.num_attention_heads, 5, draft.config.head_dim, generator=g)
    assert torch.allclose(draft.finish(out, hidden), draft.finish(out, hidden, w13=w13), atol=1e-6)
    by_heads = functools.partial(output_projection, bias=None)  # the compiled few-row form
    assert torch.allclose(draft.finish(out, hidden), draft.finish(out, hidden, by_heads=by_heads), atol=1e-5)
    assert draft.fused_weights()[0] is wqkv  # one copy per draft, shared by its runners
    with torch.no_grad():
        draft.midlayer.mlp.up_proj.weight.mul_(2)  # a changed weight: made again
    assert torch.equal(draft.fused_weights()[1][w13.shape[0] // 2 :], draft.midlayer.mlp.up_proj.weight)
    logits = torch.randn(8, 3000, generator=g)
    values, indices = top_logp(logits, 8)
    expected = torch.topk(logits.log_softmax(-1), 8)
    assert torch.equal(indices, expected.indices) and torch.allclose(values, expected.values, atol=1e-5)
