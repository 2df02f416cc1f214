"""The TTT unroll against a naive serving-style rerun per position and against the whole-grid
reference unroll, and the loss/metric arithmetic."""

import math

import pytest
import torch
import torch.nn.functional as F

from eaglekit.draft.vocab import DraftVocab
from eaglekit.features.batch import Batch, counted_positions
from eaglekit.features.teacher import dense_teacher, sparse_teacher, topk_from_logits
from eaglekit.metrics import STATS, metrics_from_stats, serving_walk
from eaglekit.train.attention import ttt_attention
from eaglekit.train.loss import every_position, step_counts, step_masks, ttt_loss
from eaglekit.train.optim import load_optimizer_tensors, lr_at, make_optimizer, optimizer_tensors
from eaglekit.train.ttt import ttt_positions, ttt_unroll
from ttt_batch import batch_for, check_unroll_against_naive, make_draft, take_steps

torch.set_num_threads(1)


def grid_unroll(draft, aux, input_ids, ttt_steps, attention="dense"):
    """The reference unroll: every step on the whole [B, L] grid, the next step's tokens shifted in by
    padding (`ttt_unroll` runs steps 1.. at gathered positions instead). [B, L, Vd] a step."""
    hidden = draft.fuse(aux[:, :-1])  # [B, L, H]: g_t
    tokens = input_ids[:, 1:]  # [B, L]: x_{t+1}
    B, L = tokens.shape
    grid = torch.arange(L).expand(B, L)
    q, k0, v0, residual = draft.attention_pieces(tokens, hidden, grid)  # step 0: the true prefix
    hidden = draft.finish(ttt_attention(q, k0, v0, [], [], attention), residual)
    logits = [draft.logits(hidden)]
    diag_k, diag_v = [], []
    for j in range(1, ttt_steps):
        q, k, v, residual = draft.attention_pieces(F.pad(tokens[:, j:], (0, j)), hidden, grid + j)
        diag_k.append(k)
        diag_v.append(v)
        hidden = draft.finish(ttt_attention(q, k0, v0, diag_k, diag_v, attention), residual)
        logits.append(draft.logits(hidden))
    return logits


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "deepseek_v3"])
def test_ttt_unroll_equals_naive_per_position_serving(arch):
    check_unroll_against_naive(make_draft(arch), T=10, steps=4)


def test_ttt_attention_sees_only_prefix_and_own_chain():
    """Changing another position's chain or a later prefix key never changes a position's output."""
    g = torch.Generator().manual_seed(0)
    B, nh, nkv, L, hd, j = 1, 4, 2, 6, 8, 3
    q = torch.randn(B, nh, L, hd, generator=g)
    k0, v0 = torch.randn(B, nkv, L, hd, generator=g), torch.randn(B, nkv, L, hd, generator=g)
    dk = [torch.randn(B, nkv, L, hd, generator=g) for _ in range(j)]
    dv = [torch.randn(B, nkv, L, hd, generator=g) for _ in range(j)]
    base = ttt_attention(q, k0, v0, dk, dv)
    t = 2
    k0b, v0b = k0.clone(), v0.clone()
    k0b[:, :, t + 1 :] += 5.0  # later prefix positions
    v0b[:, :, t + 1 :] += 5.0
    dkb = [x.clone() for x in dk]
    dvb = [x.clone() for x in dv]
    for x in dkb + dvb:
        x[:, :, t + 1] += 5.0  # another position's chain
    other = ttt_attention(q, k0b, v0b, dkb, dvb)
    torch.testing.assert_close(other[:, :, t], base[:, :, t])
    # ... but its own chain does matter
    dk_own = [x.clone() for x in dk]
    dk_own[0][:, :, t] += 5.0
    assert not torch.allclose(ttt_attention(q, k0, v0, dk_own, dv)[:, :, t], base[:, :, t])


def test_counted_positions_need_assistant_input_and_target():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    assert counted_positions(mask).int().tolist() == [[0, 0, 1, 1, 0, 0, 1, 0]]
    counts = step_counts(mask, 3)
    # step j counts raw positions 1+j.. : step 0 -> [0,1,1,0,0,1,0] = 3, step 1 -> 3, step 2 -> 2
    assert counts.tolist() == [3.0, 3.0, 2.0]


def test_metrics_simulated_accept_length():
    # 10 positions; step 0 correct on 8; of those, step 1 correct on 4; step 2 on 2 of those 4.
    stats = torch.zeros(3, len(STATS), dtype=torch.float64)
    col = {n: i for i, n in enumerate(STATS)}
    stats[:, col["valid"]] = 10
    stats[:, col["correct"]] = torch.tensor([8, 5, 6.0])
    stats[:, col["chain"]] = torch.tensor([8, 4, 2.0])
    stats[:, col["chain_prev"]] = torch.tensor([10, 8, 4.0])
    m = metrics_from_stats(stats)
    assert m["acc"] == [0.8, 0.5, 0.6]
    assert m["cond_acc"] == [0.8, 0.5, 0.5]
    assert math.isclose(m["sim_accept_length"], 1 + 0.8 + 0.4 + 0.2)


def test_metrics_module_needs_no_torch_and_reads_lists_as_tensors():
    """eaglekit.metrics is the low floor train, engine, doctor and bench share: importing it loads no
    torch, and the host lists of a stats tensor give the tensor's metrics."""
    import subprocess
    import sys

    code = "import sys, eaglekit.metrics; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    stats = torch.rand(3, len(STATS), dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 9 + 1
    assert metrics_from_stats(stats.tolist()) == metrics_from_stats(stats)


def test_loss_is_weighted_soft_ce_over_counted_in_vocab_positions():
    draft = make_draft()
    batch, logits_t = batch_for(draft)
    steps = 3
    with torch.no_grad():
        logits = ttt_unroll(draft, batch.aux, batch.input_ids, steps)
    den = step_counts(batch.loss_mask, steps)
    out = ttt_loss(logits, batch, draft.d2t, draft.t2d, weights=[1.0, 0.8, 0.64], denominators=den)
    draft_ids = draft.t2d.nonzero().squeeze(1)
    expected = 0.0
    counted = counted_positions(batch.loss_mask)
    for j in range(steps):
        total = 0.0
        for b in range(2):
            for t in range(9 - 1 - j):
                s = t + 1 + j
                if not counted[b, s] or not draft.t2d[logits_t[b, s].argmax()]:
                    continue
                p = logits_t[b, s, draft_ids].softmax(-1)
                total += -(p * logits[j][b, t].log_softmax(-1)).sum()
        expected += 0.8**j * total / den[j]
    torch.testing.assert_close(out.loss, torch.as_tensor(expected, dtype=torch.float32), rtol=1e-4, atol=1e-5)


def test_sparse_teacher_with_full_topk_equals_dense():
    draft = make_draft()
    V = draft.config.vocab_size
    dense, _ = batch_for(draft, teacher_kind="dense")
    sparse, _ = batch_for(draft, teacher_kind="sparse", k=V)
    with torch.no_grad():
        logits = ttt_unroll(draft, dense.aux, dense.input_ids, 2)
    den = step_counts(dense.loss_mask, 2)
    a = ttt_loss(logits, dense, draft.d2t, draft.t2d, weights=[1, 0.8], denominators=den)
    b = ttt_loss(logits, sparse, draft.d2t, draft.t2d, weights=[1, 0.8], denominators=den)
    torch.testing.assert_close(a.loss, b.loss, rtol=2e-3, atol=1e-4)  # float16 log-probs
    torch.testing.assert_close(a.stats, b.stats, rtol=2e-3, atol=1e-3)


def test_oov_positions_get_no_loss_but_count_as_misses():
    draft = make_draft(vocab=40)
    V = draft.config.vocab_size
    B, T = 1, 6
    oov = int((~draft.t2d).nonzero()[0])
    logits_t = torch.zeros(B, T, V)
    logits_t[..., oov] = 20.0  # the target always picks a token the draft cannot propose
    teacher = dense_teacher(logits_t, draft.t2d.nonzero().squeeze(1))
    batch = Batch(
        torch.randint(3, 300, (B, T)),
        torch.ones(B, T, dtype=torch.bool),
        torch.randn(B, T, draft.config.fused_width),
        teacher,
        torch.tensor([T]),
    )
    logits = ttt_unroll(draft, batch.aux, batch.input_ids, 2)
    out = ttt_loss(logits, batch, draft.d2t, draft.t2d, weights=[1, 0.8], denominators=step_counts(batch.loss_mask, 2))
    assert float(out.loss.detach()) == 0.0
    m = metrics_from_stats(out.stats)
    assert m["acc"] == [0.0, 0.0] and m["positions"] == T - 2 and m["oov_share"] == 1.0
    assert m["sim_accept_length"] == 1.0


def test_topk_teacher_keeps_exact_argmax_and_log_probs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 50, generator=g) * 4
    ids, logp = topk_from_logits(logits, 5, chunk_tokens=3)
    assert ids.dtype == torch.int32 and logp.dtype == torch.float16
    assert torch.equal(ids[:, 0].long(), logits.argmax(-1))
    ref = logits.log_softmax(-1).gather(-1, ids.long())
    torch.testing.assert_close(logp.float(), ref, atol=2e-2, rtol=1e-3)


def test_lr_schedule_warmup_and_decay():
    kw = dict(lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(13, **kw, schedule="cosine") > 0.1 and lr_at(14, **kw, schedule="cosine") == pytest.approx(0.1)
    assert lr_at(9, **kw, schedule="linear") == pytest.approx(0.1 + 0.9 * 0.5)


def test_optimizer_state_round_trips_exactly_without_pickle():
    draft = make_draft()
    names = [n for n, p in draft.named_parameters() if p.requires_grad]
    params = dict(draft.named_parameters())
    opt = make_optimizer([(n, params[n]) for n in names], lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    take_steps(draft, opt)
    tensors, meta = optimizer_tensors(opt, names)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    opt2 = make_optimizer([(n, params[n]) for n in names], lr=5.0, weight_decay=0.0, betas=(0.5, 0.5))
    load_optimizer_tensors(opt2, tensors, meta, names)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for key in a["state"][i]:
            assert torch.equal(a["state"][i][key], b["state"][i][key])


def test_serving_walk_replays_greedy_chains():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)
    run = torch.tensor([[2, 0, 0, 1, 0, 0, 3, 3, 0, 1]])
    # span 0..5: cycles at t=0 (3 tokens), t=3 (2), t=5 (1); span 8..9: t=8 (1), t=9 (2)
    assert serving_walk(mask, run) == (9, 5)
    # Served with a chain of 1 draft: t=0 (2), t=2 (1), t=3 (2), t=5 (1); t=8 (1), t=9 (2)
    assert serving_walk(mask, run, max_drafts=1) == (9, 6)


def spans_batch(draft, seed=3):
    """Rows of different lengths (right padding), two answer spans in a row, a user turn between, and a
    teacher that agrees with the draft often enough for chains of several steps."""
    g = torch.Generator().manual_seed(seed)
    B, T, V = 3, 16, draft.config.vocab_size
    lengths = torch.tensor([16, 11, 7])
    ids = torch.randint(3, 300, (B, T), generator=g) * (torch.arange(T) < lengths[:, None])
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 3:8] = mask[0, 10:16] = True
    mask[1, 2:11] = True
    mask[2, 4:7] = True
    aux = torch.randn(B, T, draft.config.fused_width, generator=g)
    with torch.no_grad():
        guesses = [x.argmax(-1) for x in ttt_unroll(draft, aux, ids, 2)]  # [B, L] draft ids
    logits = torch.randn(B, T, V, generator=g)
    rows, pos = every_position(B, T - 1, "cpu")
    for b, t in zip(rows.tolist(), pos.tolist()):
        for j in range(2 if t % 2 else 0):  # odd t: step 0 (raw t+1) and step 1 (raw t+2) are right
            if t + 1 + j < T:
                guess = int(guesses[j][b, t])
                logits[b, t + 1 + j, guess + int(draft.d2t[guess])] += 30.0
    teacher = dense_teacher(logits, draft.t2d.nonzero().squeeze(1))
    return Batch(ids, mask, aux, teacher, lengths)


def naive_step_stats(logits, batch, d2t, steps):
    """valid, correct, chain, chain_prev per step by the definitions, one position at a time."""
    counted = counted_positions(batch.loss_mask)
    B, L = logits[0].shape[:2]
    out = torch.zeros(steps, 4, dtype=torch.float64)
    for b in range(B):
        for t in range(L):
            alive = True
            for j in range(steps):
                s = t + 1 + j
                if s >= L + 1 or not counted[b, s]:
                    alive = False
                    continue
                guess = int(logits[j][b, t].argmax())
                correct = guess + int(d2t[guess]) == int(batch.teacher.argmax[b, s])
                out[j] += torch.tensor([1, correct, alive and correct, alive], dtype=torch.float64)
                alive = alive and correct
    return out


@pytest.mark.parametrize("teacher_kind", ["dense", "sparse"])
def test_the_head_at_counted_positions_gives_the_whole_grids_loss_metrics_and_gradients(teacher_kind):
    from eaglekit.train.loop import TTTModel, unrolled_loss

    draft = make_draft()
    steps = 3
    batch = spans_batch(draft)
    if teacher_kind == "sparse":
        k = 5
        full = torch.full((*batch.input_ids.shape, draft.config.vocab_size), -1e4)
        full[..., draft.t2d] = batch.teacher.probs.log()
        tids, tlogp = topk_from_logits(full.view(-1, full.shape[-1]), k)
        vocab = DraftVocab(draft_ids=draft.t2d.nonzero().squeeze(1), vocab_size=draft.config.vocab_size)
        batch.teacher = sparse_teacher(
            tids.view(*full.shape[:2], k), tlogp.view(*full.shape[:2], k), vocab.target_to_draft
        )
    rows, pos = ttt_positions(batch.loss_mask, steps)
    held = set(zip(rows.tolist(), pos.tolist()))
    for m in step_masks(batch.loss_mask, steps):
        assert {(b, t) for b, t in m.nonzero().tolist()} <= held  # every counted position is there
    assert len(held) < batch.input_ids.shape[0] * (batch.input_ids.shape[1] - 1)  # and not the whole grid
    model = TTTModel(draft, steps, "merged")
    params = [p for p in draft.parameters() if p.requires_grad]
    den = step_counts(batch.loss_mask, steps)
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[1.0, 0.8, 0.64])
    counted = unrolled_loss(model, batch, den, **kw)
    grid = unrolled_loss(model, batch, den, **kw, every_position=True)
    torch.testing.assert_close(counted.loss, grid.loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(counted.stats, grid.stats, atol=1e-4, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(counted.loss, params), torch.autograd.grad(grid.loss, params)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        logits = ttt_unroll(draft, batch.aux, batch.input_ids, steps, "merged")
    naive = naive_step_stats(logits, batch, draft.d2t, steps)
    assert naive[1, 2] > 0  # chains of two drafts happen
    assert torch.equal(counted.stats[:, :4], naive)
    walked = ttt_loss(
        [x[rows, pos] for x in logits],
        batch,
        draft.d2t,
        draft.t2d,
        weights=kw["weights"],
        denominators=den,
        walk=True,
        positions=(rows, pos),
    )
    reference = ttt_loss(logits, batch, draft.d2t, draft.t2d, weights=kw["weights"], denominators=den, walk=True)
    assert torch.equal(walked.stats[:, 7:], reference.stats[:, 7:]) and walked.stats[:, 7].min() > 0


@pytest.mark.parametrize("attention", ["dense", "merged"])
def test_steps_after_the_first_at_the_positions_equal_the_grids(attention):
    """Steps 1.. run on the gathered positions (step 0 on the grid, whose keys are the prefix): their
    logits and the gradients through them are the reference whole-grid unroll's at those positions."""
    draft = make_draft().train()
    batch = spans_batch(draft)
    steps = 4
    rows, pos = ttt_positions(batch.loss_mask, steps)
    params = [p for p in draft.parameters() if p.requires_grad]
    gathered = ttt_unroll(draft, batch.aux, batch.input_ids, steps, attention, (rows, pos))
    grid = [x[rows, pos] for x in grid_unroll(draft, batch.aux, batch.input_ids, steps, attention)]
    weight = torch.randn(len(rows), gathered[0].shape[-1], generator=torch.Generator().manual_seed(5))
    for a, b in zip(gathered, grid):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # positions None: every position
        whole, reference = (f(draft, batch.aux, batch.input_ids, steps, attention) for f in (ttt_unroll, grid_unroll))
    for a, b in zip(whole, reference):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    total = lambda xs: sum(((x * weight).sum() * (j + 1)) for j, x in enumerate(xs))  # noqa: E731
    for a, b in zip(torch.autograd.grad(total(gathered), params), torch.autograd.grad(total(grid), params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
