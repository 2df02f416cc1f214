"""A tiny seeded draft (`make_draft`), its naive serving-style rerun per position
(`naive_chains`), a random training batch with its teacher (`batch_for`), random teachers (`teachers`)
and the plain soft CE (`plain_soft_ce`), shared by the TTT, training-speed, layout and GPU tests."""

import torch

from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft
from eaglekit.draft.vocab import DraftVocab
from eaglekit.features.batch import Batch
from eaglekit.features.teacher import Teacher, dense_teacher, sparse_teacher, topk_from_logits
from tiny import tiny_config


def make_draft(arch="llama", vocab=120, seed=0):
    cfg = DraftConfig.for_target(tiny_config(arch), aux_layer_ids=[1, 3, 5], draft_vocab_size=vocab)
    torch.manual_seed(seed)
    draft = Eagle3Draft(cfg).eval()
    ids = torch.sort(torch.randperm(cfg.vocab_size)[:vocab]).values
    DraftVocab(draft_ids=ids, vocab_size=cfg.vocab_size).apply_to(draft)
    return draft


def batch_for(draft, T=9, B=2, seed=0, teacher_kind="dense", k=None):
    g = torch.Generator().manual_seed(seed)
    V = draft.config.vocab_size
    ids = torch.randint(3, 300, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :3] = False
    logits = torch.randn(B, T, V, generator=g) * 3
    if teacher_kind == "dense":
        teacher = dense_teacher(logits, draft.t2d.nonzero().squeeze(1))
    else:
        tids, tlogp = topk_from_logits(logits.view(-1, V), k)
        vocab = DraftVocab(draft_ids=draft.t2d.nonzero().squeeze(1), vocab_size=V)
        teacher = sparse_teacher(tids.view(B, T, k), tlogp.view(B, T, k), vocab.target_to_draft)
    aux = torch.randn(B, T, draft.config.fused_width, generator=g)
    return Batch(ids, mask, aux, teacher, torch.full((B,), T)), logits


def plain_soft_ce(logits, teacher):
    """The formula `ttt_loss` used before: log_softmax in fp32, then the teacher's cross-entropy."""
    return teacher.cross_entropy(logits.float().log_softmax(-1))


def teachers(B, L, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = Teacher(argmax=torch.zeros(B, L, dtype=torch.long), probs=torch.randn(B, L, V, generator=g).softmax(-1))
    k = 5
    probs = torch.randn(B, L, k, generator=g).softmax(-1)
    probs[0, 1] = 0.0  # a position with no teacher entry in the draft vocab
    sparse = Teacher(argmax=dense.argmax, probs=probs, index=torch.randint(0, V, (B, L, k), generator=g))
    return {"dense": dense, "sparse": sparse}


@torch.no_grad()
def naive_chains(draft, aux, input_ids, steps):
    """Serve each position separately: catch up on the true prefix, then draft `steps` tokens with a KV cache.

    The drafted tokens are replaced by the ground-truth ones (as TTT does), so logits must agree exactly.
    """
    B, T = input_ids.shape
    fused = draft.fuse(aux[:, :-1])
    tokens = input_ids[:, 1:]
    L = T - 1
    out = {}
    for t in range(L):
        logits, hidden, kv = draft(tokens[:, : t + 1], fused[:, : t + 1])  # true prefix 0..t
        out[(0, t)] = logits[:, t]
        h = hidden[:, t : t + 1]
        for j in range(1, steps):
            if t + j >= L:
                break
            logits, h, kv = draft(tokens[:, t + j : t + j + 1], h, position_ids=torch.full((B, 1), t + j), past_kv=kv)
            out[(j, t)] = logits[:, 0]
    return out


def check_unroll_against_naive(draft, T, steps):
    """`ttt_unroll` over a random batch gives, at every (step, position), the logits `naive_chains` serves."""
    from eaglekit.train.ttt import ttt_unroll

    B = 2
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (B, T), generator=g)
    aux = torch.randn(B, T, draft.config.fused_width, generator=g)
    with torch.no_grad():
        logits = ttt_unroll(draft, aux, ids, steps)
    ref = naive_chains(draft, aux, ids, steps)
    assert [tuple(x.shape) for x in logits] == [(B, T - 1, draft.config.draft_vocab_size)] * steps
    for (j, t), expected in ref.items():
        torch.testing.assert_close(logits[j][:, t], expected, atol=2e-5, rtol=1e-4)
    assert len(ref) == sum(T - 1 - j for j in range(steps))


def take_steps(draft, optimizer, n=2):
    """n optimizer steps of a 2-step TTT unroll on `batch_for(draft)` (a state to save and compare)."""
    from eaglekit.train.loss import step_counts, ttt_loss
    from eaglekit.train.ttt import ttt_unroll

    batch, _ = batch_for(draft)
    for _ in range(n):
        logits = ttt_unroll(draft, batch.aux, batch.input_ids, 2)
        ttt_loss(
            logits, batch, draft.d2t, draft.t2d, weights=[1, 0.8], denominators=step_counts(batch.loss_mask, 2)
        ).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
