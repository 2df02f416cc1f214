"""`--objective`: the LK losses (train/loss.py `objective_loss`) against naive formulas in fp64, the
trained positions they keep, soft-ce unchanged, the compiled step functions against eager (dynamo's
graphs; inductor's kernels: tests/integration/test_train_objective.py), and a short run from the CLI."""

import json

import pytest
import torch

from eaglekit.artifacts import MANIFEST
from eaglekit.cli import main
from eaglekit.errors import EaglekitError
from eaglekit.features.batch import counted_positions
from eaglekit.features.teacher import Teacher
from eaglekit.train.config import TrainConfig
from eaglekit.train.loss import LK_ETA, objective_loss, step_counts, ttt_loss
from eaglekit.train.ttt import ttt_unroll
from train_tiny import (
    config,
    train_args,
    train_data,  # noqa: F401 (fixture `data`)
)
from ttt_batch import batch_for, make_draft


def dense_p(teacher: Teacher, Vd: int) -> torch.Tensor:
    """The teacher's p over the whole draft vocab, [B, L, Vd] (a sparse teacher's k entries scattered)."""
    if teacher.index is None:
        return teacher.probs
    zeros = teacher.probs.new_zeros(*teacher.probs.shape[:-1], Vd)
    return zeros.scatter_add(-1, teacher.index, teacher.probs)


def teacher_and_logits(kind: str, dtype=torch.float32, seed=0):
    draft = make_draft()
    batch, _ = batch_for(draft, teacher_kind=kind, k=8, seed=seed)
    t = batch.teacher
    teacher = Teacher(t.argmax, t.probs.to(dtype), t.index)
    g = torch.Generator().manual_seed(seed + 1)
    logits = (torch.randn(*t.argmax.shape, draft.config.draft_vocab_size, generator=g) * 3).to(dtype)
    return teacher, logits


def naive_alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sum_v min(p(v), q(v)), spelled out (dense p)."""
    return torch.where(q < p, q, p).sum(-1)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_acceptance_is_the_sum_of_min_p_q(kind):
    teacher, logits = teacher_and_logits(kind, torch.float64)
    Vd = logits.shape[-1]
    q = logits.softmax(-1)
    p = dense_p(teacher, Vd)
    B, L = teacher.argmax.shape
    naive = torch.tensor(
        [[sum(min(a, b) for a, b in zip(p[r, t].tolist(), q[r, t].tolist())) for t in range(L)] for r in range(B)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(teacher.acceptance(q), naive, rtol=1e-12, atol=1e-12)
    # 1 - alpha is the total variation where p is a distribution (a sparse position whose top-k is all
    # outside the draft vocab has p = 0 and alpha = 0)
    full = p.sum(-1) > 0.5
    tv = 0.5 * (p - q).abs().sum(-1)
    torch.testing.assert_close((1 - teacher.acceptance(q))[full], tv[full])
    assert (teacher.acceptance(q)[~full] == 0).all()


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_minus_log_alpha_has_tvs_gradient_over_alpha(kind):
    """fp64: autograd of -log alpha passes gradcheck, and equals the closed form
    d(-log alpha)/dz_i = -q_i (m_i - sum_v q_v m_v) / alpha with m = [q < p] (TV's gradient over alpha)."""
    teacher, logits = teacher_and_logits(kind, torch.float64)
    z = logits[:1, :4].clone().requires_grad_()  # gradcheck's Jacobian: keep it small
    part = Teacher(
        teacher.argmax[:1, :4], teacher.probs[:1, :4], None if teacher.index is None else teacher.index[:1, :4]
    )
    assert (part.probs.sum(-1) > 0).all()
    assert torch.autograd.gradcheck(lambda x: -torch.log(part.acceptance(x.softmax(-1))), (z,))
    q = z.softmax(-1)
    alpha = part.acceptance(q)
    (grad,) = torch.autograd.grad(-torch.log(alpha).sum(), z)
    m = (q < dense_p(part, z.shape[-1])).double()
    closed = -(q * (m - (q * m).sum(-1, keepdim=True))) / alpha.unsqueeze(-1)
    torch.testing.assert_close(grad, closed.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("objective", ["lk-alpha", "lk-hybrid"])
def test_objective_loss_matches_the_naive_formula_in_fp64(kind, objective):
    """What training runs (fp32) against the paper's formulas written out in fp64, values and gradients."""
    teacher, logits = teacher_and_logits(kind)
    Vd = logits.shape[-1]
    trained = teacher.probs.sum(-1) > 0  # [B, L]: a sparse position with no draft-vocab entry is never trained
    trained[0, 0] = False
    weight = torch.rand(trained.shape, generator=torch.Generator().manual_seed(3))
    z32 = logits.clone().requires_grad_()
    loss, ce = objective_loss(z32, teacher, trained, objective=objective)
    (g32,) = torch.autograd.grad((loss * weight * trained).sum(), z32)

    z = logits.double().requires_grad_()
    p = dense_p(teacher, Vd).double()
    q = z.softmax(-1)
    alpha = naive_alpha(p, q)
    ce64 = -(p * z.log_softmax(-1)).sum(-1)
    if objective == "lk-alpha":
        want = -torch.log(alpha)
    else:
        lam = torch.exp(-LK_ETA * alpha.detach()[trained].mean())  # a constant of the backward
        want = lam * ce64 + (1 - lam) * (1 - alpha)
    (g64,) = torch.autograd.grad((want * weight * trained).sum(), z)
    torch.testing.assert_close(loss[trained].double(), want[trained].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ce.double(), ce64.detach(), rtol=1e-5, atol=1e-5)  # the metric stays the soft CE
    torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-6)
    assert torch.isfinite(loss).all()  # alpha = 0 (no entry in the draft vocab) stays finite


def unrolled(objective: str, kind="dense", **kw):
    draft = make_draft()
    batch, logits_t = batch_for(draft, teacher_kind=kind, k=8)
    steps = 3
    logits = ttt_unroll(draft, batch.aux, batch.input_ids, steps)
    den = step_counts(batch.loss_mask, steps)
    out = ttt_loss(
        logits, batch, draft.d2t, draft.t2d, weights=[1.0, 0.8, 0.64], denominators=den, objective=objective, **kw
    )
    return out, draft, batch, logits_t, logits, den


def test_soft_ce_objective_is_the_default_loss_bit_for_bit():
    default, *_ = unrolled("soft-ce")
    draft = make_draft()
    batch, _ = batch_for(draft)
    logits = ttt_unroll(draft, batch.aux, batch.input_ids, 3)
    den = step_counts(batch.loss_mask, 3)
    before = ttt_loss(logits, batch, draft.d2t, draft.t2d, weights=[1.0, 0.8, 0.64], denominators=den)
    assert torch.equal(default.loss, before.loss) and torch.equal(default.stats, before.stats)


def test_lk_alpha_is_weighted_minus_log_alpha_over_counted_in_vocab_positions():
    """The trained positions are the soft CE's (counted, target argmax in the draft vocab), and the
    metric sums stay the soft CE's."""
    out, draft, batch, logits_t, logits, den = unrolled("lk-alpha")
    draft_ids = draft.t2d.nonzero().squeeze(1)
    counted = counted_positions(batch.loss_mask)
    expected, skipped = 0.0, 0
    for j in range(3):
        total = 0.0
        for b in range(2):
            for t in range(9 - 1 - j):
                s = t + 1 + j
                if not counted[b, s] or not draft.t2d[logits_t[b, s].argmax()]:
                    skipped += bool(counted[b, s])
                    continue
                p = logits_t[b, s, draft_ids].softmax(-1)
                total += -torch.log(torch.minimum(p, logits[j][b, t].softmax(-1)).sum())
        expected += 0.8**j * total / den[j]
    assert skipped > 0  # some counted positions have their target's argmax outside the draft vocab
    torch.testing.assert_close(out.loss, torch.as_tensor(expected, dtype=torch.float32), rtol=1e-4, atol=1e-5)
    soft_ce, *_ = unrolled("soft-ce")
    torch.testing.assert_close(out.stats, soft_ce.stats, rtol=1e-6, atol=1e-5)


def test_compiled_steps_give_the_eager_lk_losses():
    """`train --compile` traces `score_step` with the objective (dynamo's graphs here: fast), loss,
    stats and gradients as eager, for both teachers."""
    from torch._dynamo.utils import counters

    from eaglekit.train.loop import TTTModel, compiled_unrolled_loss, unrolled_loss

    torch._dynamo.reset()
    counters.clear()
    draft = make_draft()
    steps = 3
    model = TTTModel(draft, steps, "merged")
    params = [p for p in draft.parameters() if p.requires_grad]
    compiled = compiled_unrolled_loss("eager")
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[0.8**j for j in range(steps)])
    for objective in ("lk-alpha", "lk-hybrid"):
        for kind in ("dense", "sparse"):
            batch, _ = batch_for(draft, T=11, teacher_kind=kind, k=8)
            den = step_counts(batch.loss_mask, steps)
            out = compiled(model, batch, den, objective=objective, **kw)
            ref = unrolled_loss(model, batch, den, objective=objective, **kw)
            torch.testing.assert_close(out.loss, ref.loss)
            torch.testing.assert_close(out.stats, ref.stats)
            for a, b in zip(torch.autograd.grad(out.loss, params), torch.autograd.grad(ref.loss, params)):
                torch.testing.assert_close(a, b)
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_objective_settings_are_checked_and_recorded(tmp_path):
    base = dict(target="x", data="x", out=str(tmp_path))
    with pytest.raises(EaglekitError, match="--soft-ce fused is a kernel of the soft-ce objective") as err:
        TrainConfig(**base, objective="lk-alpha", soft_ce="fused")
    assert "drop --soft-ce fused" in err.value.hint
    with pytest.raises(EaglekitError, match="unknown objective"):
        TrainConfig(**base, objective="tv")
    TrainConfig(**base, objective="lk-hybrid", compile=True)  # --compile traces the LK formulas
    with pytest.raises(EaglekitError, match="unknown objective"):
        objective_loss(
            torch.zeros(1, 2, 3), teacher_and_logits("dense")[0], torch.ones(1, 2, dtype=torch.bool), objective="kl"
        )
    # soft-ce leaves the resume key as states written before --objective hold it; an LK run's names it
    assert (
        "objective" not in TrainConfig(**base).resume_key() and TrainConfig(**base).to_dict()["objective"] == "soft-ce"
    )
    assert TrainConfig(**base, objective="lk-alpha").resume_key()["objective"] == "lk-alpha"


def test_lk_alpha_from_the_cli_records_its_objective_and_lowers_its_loss(data, tmp_path):
    out = tmp_path / "run"
    args = train_args(
        data, out, "--objective", "lk-alpha", "--max-steps", "24", "--log-every", "4", "--val-every", "24"
    )
    assert main(args) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["complete"] and manifest["config"]["objective"] == "lk-alpha"
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    losses = [x["loss"] for x in lines if x["event"] == "train"]
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0], losses
    # the soft CE it is not trained on falls too, and the draft learns its top-1 (acc_0)
    train = [x for x in lines if x["event"] == "train"]
    assert train[-1]["ce"][0] < train[0]["ce"][0] and train[-1]["acc"][0] > train[0]["acc"][0]
    assert config(data, tmp_path / "x").to_dict()["objective"] == "soft-ce"
