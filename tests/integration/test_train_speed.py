"""The training step and the soft CE under torch.compile (Dynamo + AOTAutograd, and Inductor's CPU kernels)
against eager, in fp32 on tiny shapes (minutes each on 2 cores)."""

import pytest
import torch

from eaglekit.train.loss import soft_cross_entropy, step_counts
from ttt_batch import batch_for, make_draft, plain_soft_ce, teachers


def compiled_vs_eager(backend, shapes):
    """The compiled unroll + loss against the eager one on each (T, B) batch shape."""
    from eaglekit.train.loop import TTTModel, compiled_unrolled_loss, unrolled_loss

    draft = make_draft()
    steps = 2
    model = TTTModel(draft, steps, "merged")
    params = [p for p in draft.parameters() if p.requires_grad]
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[1.0, 0.8])
    compiled = compiled_unrolled_loss(backend)
    for T, B in shapes:
        batch, _ = batch_for(draft, T=T, B=B)
        den = step_counts(batch.loss_mask, steps)
        a = compiled(model, batch, den, **kw)
        b = unrolled_loss(model, batch, den, **kw)
        torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.stats, b.stats, atol=1e-5, rtol=1e-5)
        for x, y in zip(torch.autograd.grad(a.loss, params), torch.autograd.grad(b.loss, params)):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_compiled_step_traces_to_the_eager_numbers():
    """Dynamo + AOTAutograd (the merged attention's Function, the plain CE), without inductor's codegen
    (~1-2 minutes of tracing on 2 cores)."""
    compiled_vs_eager("aot_eager", [(11, 2), (9, 3)])  # the second shape runs the dynamic graph


@pytest.mark.slow
def test_compiled_step_equals_eager_with_inductor():
    """What --compile runs (inductor's CPU kernels; ~4 minutes on 2 cores, so one shape)."""
    compiled_vs_eager("inductor", [(11, 2)])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_compiled_soft_ce_equals_the_plain_formula(kind):
    """`--soft-ce compiled`: the plain formula through inductor (its CPU kernels here; ~1 minute on 2 cores),
    on two position counts (the graph is dynamic in them)."""
    for L in (9, 14):
        teacher = teachers(2, L, 31)[kind]
        logits = (torch.randn(2, L, 31, generator=torch.Generator().manual_seed(L)) * 3).requires_grad_()
        weight = torch.rand(2, L, generator=torch.Generator().manual_seed(2))
        compiled = soft_cross_entropy(logits, teacher, soft_ce="compiled")
        plain = plain_soft_ce(logits, teacher)
        torch.testing.assert_close(compiled, plain, atol=1e-5, rtol=1e-5)
        (g_compiled,) = torch.autograd.grad((compiled * weight).sum(), logits)
        (g_plain,) = torch.autograd.grad((plain * weight).sum(), logits)
        torch.testing.assert_close(g_compiled, g_plain, atol=1e-6, rtol=1e-5)
