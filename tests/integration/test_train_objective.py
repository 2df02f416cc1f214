"""The LK objectives under inductor (its CPU kernels): `score_step` as `train --compile` runs it, against
eager, on tiny random step logits (dynamo's graphs of the whole step: tests/unit/test_train_objective.py)."""

import pytest
import torch

from eaglekit.train.loss import step_counts, ttt_loss
from eaglekit.train.ttt import compiled_steps, ttt_positions
from ttt_batch import batch_for, make_draft


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["lk-alpha", "lk-hybrid"])
def test_compiled_score_gives_the_eager_lk_loss(objective):
    """Only `score` compiles here (the draft's step functions are not called): one graph, about a minute
    on 2 cores; loss, metric sums and the gradient of the step logits, on both teachers."""
    torch._dynamo.reset()
    draft = make_draft()
    steps = 2
    for kind in ("dense", "sparse"):
        batch, _ = batch_for(draft, T=9, teacher_kind=kind, k=8)
        positions = ttt_positions(batch.loss_mask, steps)
        g = torch.Generator().manual_seed(1)
        N, Vd = positions[0].shape[0], draft.config.draft_vocab_size
        logits = [(torch.randn(N, Vd, generator=g) * 3).requires_grad_() for _ in range(steps)]
        kw = dict(
            weights=[1.0, 0.8],
            denominators=step_counts(batch.loss_mask, steps),
            objective=objective,
            positions=positions,
        )
        eager = ttt_loss(logits, batch, draft.d2t, draft.t2d, **kw)
        compiled = ttt_loss(logits, batch, draft.d2t, draft.t2d, steps=compiled_steps("inductor"), **kw)
        torch.testing.assert_close(compiled.loss, eager.loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled.stats, eager.stats, atol=1e-5, rtol=1e-5)
        for a, b in zip(torch.autograd.grad(compiled.loss, logits), torch.autograd.grad(eager.loss, logits)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    torch._dynamo.reset()
