"""The training objective: the TTT loss over the unrolled draft steps, and the soft cross-entropy in it.

Loss at step j: soft cross-entropy against the target's distribution p restricted to the draft
vocab, weight decay**j (`TrainConfig.step_weights`), averaged over the counted positions of the
whole optimizer step. A position counts when both its input token and the token it predicts were
written by the assistant (the draft is only ever asked to continue an answer, and never to predict
past the end of turn). Positions whose target argmax is outside the draft vocab get no loss (no
draft can propose that token, and the renormalized teacher would teach a token the target does not
pick) but stay in the denominators of the metrics as misses, so acc_j and the simulated accept
length are what serving can reach (eaglekit.metrics reads the sums this file accumulates).

The soft cross-entropy -sum_v p(v) log q(v), q = softmax(z), in two forms:
- plain (the default): log_softmax in fp32, then the teacher's dot (`plain_soft_cross_entropy`);
  `--soft-ce compiled` runs the same formula under torch.compile, and `train --compile` traces it.
- fused (`SoftCrossEntropy`, `--soft-ce fused`): keeps no fp32 log-probabilities for the backward.
  The plain form's autograd keeps the fp32 log-probs of all TTT steps (1 GiB a step at 16384 tokens
  x 16384 draft ids); the fused one keeps only the logits (in their own dtype, bf16 under autocast)
  and the lse, works in fp32 on position chunks of bounded size, and recomputes softmax(z) in the
  backward: ce = lse(z) * sum_v p(v) - sum_v p(v) z(v), dz = dce * (softmax(z) * sum p - p).

`--objective` picks what the loss is (`objective_loss`); soft-ce, the default, is the above. The LK
losses ("LK Losses: Direct Acceptance Rate Optimization for Speculative Decoding", arXiv 2602.23881)
optimize the acceptance rate alpha = sum_v min(p(v), q(v)) = 1 - TV(p, q) (`Teacher.acceptance`), the
chance that speculative sampling accepts a token drawn from q, against the same p the soft CE uses:
- lk-alpha: -log alpha. Its gradient is TV's divided by alpha, so it does not vanish while the draft
  still puts little mass where p is (pure TV's does, from scratch).
- lk-hybrid: lam * soft CE + (1 - lam) * (1 - alpha), lam = exp(-LK_ETA * mean alpha) with the mean over
  the step's trained positions of the micro-batch, detached: mostly the soft CE while the draft's
  acceptance is low, mostly TV as it rises. The paper blends KL, which is the soft CE less the
  teacher's entropy: the same gradient, since lam is a constant of the backward.
Both run the plain formula (log-softmax or softmax in fp32), eagerly or traced by `train --compile`;
`--soft-ce` picks the soft-ce objective's kernel only (config.py refuses it with the LK losses). The
metric sums keep the soft CE under every objective, so runs with different objectives compare on `ce`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from eaglekit.errors import EaglekitError
from eaglekit.features.batch import Batch, counted_positions
from eaglekit.features.teacher import Teacher
from eaglekit.metrics import STATS, serving_walks
from eaglekit.train.config import OBJECTIVES, SOFT_CES

CHUNK_ELEMENTS = 2**27  # fp32 working set per chunk of the fused soft CE: 512 MiB
LK_ETA = 3.0  # lk-hybrid's decay of the soft CE's weight with the acceptance rate (docs/notes/training.md)
ALPHA_FLOOR = torch.finfo(torch.float32).tiny  # -log alpha stays finite where q underflows on p's support


# ---- the soft cross-entropy -----------------------------------------------------------------------


def soft_cross_entropy(
    logits: torch.Tensor, teacher: Teacher, *, soft_ce: str = "plain", chunk_elements: int = CHUNK_ELEMENTS
) -> torch.Tensor:
    """Per-position soft CE [B, L] (fp32) of `logits` [B, L, Vd] against `teacher` (same positions).

    soft_ce: "plain" (`plain_soft_cross_entropy`: what `train` runs, and what `train --compile`
    traces), "fused" (`SoftCrossEntropy`: keeps no fp32 log-probs for the backward) or "compiled"
    (the plain formula under torch.compile, `compiled_soft_cross_entropy`).
    """
    if soft_ce == "plain":
        return plain_soft_cross_entropy(logits, teacher)
    if soft_ce == "fused":
        return SoftCrossEntropy.apply(logits, teacher.probs, teacher.index, chunk_elements)
    if soft_ce == "compiled":
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # never eager unannounced
            return compiled_soft_cross_entropy()(logits, teacher)
    raise EaglekitError(f"unknown soft CE {soft_ce!r}", hint=f"use one of {', '.join(SOFT_CES)}")


def plain_soft_cross_entropy(logits: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """Log-softmax, then the teacher's dot. `log_softmax(dtype=float32)` reads bf16 logits in one CUDA
    kernel (no fp32 copy first), and its backward writes bf16 again: about 10 passes over [N, Vd] a
    step, where lse(z) * sum p - p.z in eager takes about 25 (logsumexp alone is four kernels, and its
    backward three more)."""
    return teacher.cross_entropy(torch.log_softmax(logits, -1, dtype=torch.float32))


@functools.cache
def compiled_soft_cross_entropy(backend: str = "inductor"):
    """`plain_soft_cross_entropy` under torch.compile, built once and dynamic in the positions:
    inductor fuses its forward and its backward into about one pass each over [N, Vd] (logits and
    teacher read, the gradient written), where eager makes about five each."""
    return torch.compile(plain_soft_cross_entropy, dynamic=True, backend=backend)


def position_chunks(shape: torch.Size, chunk_elements: int) -> list[slice]:
    """Slices of dim 1 of a [B, L, V] tensor, each at most ~chunk_elements (strided views, no copies)."""
    B, L, V = shape
    rows = max(1, chunk_elements // max(1, B * V))
    return [slice(s, min(s + rows, L)) for s in range(0, L, rows)]


def teacher_dot(z: torch.Tensor, probs: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """sum_v p(v) z(v): [B, l, V] fp32 logits, dense [B, l, V] or sparse [B, l, k] teacher -> [B, l]."""
    if index is None:
        return (probs * z).sum(-1)
    return (probs * z.gather(-1, index)).sum(-1)


class SoftCrossEntropy(torch.autograd.Function):
    """ce [B, L] fp32 from logits [B, L, Vd] (any float dtype) and the teacher's probs (+ sparse index)."""

    @staticmethod
    def forward(ctx, logits, probs, index, chunk_elements):
        lse = logits.new_empty(logits.shape[:2], dtype=torch.float32)  # [B, L]
        ce = torch.empty_like(lse)
        for part in position_chunks(logits.shape, chunk_elements):
            z = logits[:, part].float()  # [B, l, Vd]
            lse[:, part] = z.logsumexp(-1)
            p, ix = probs[:, part], None if index is None else index[:, part]
            ce[:, part] = lse[:, part] * p.sum(-1) - teacher_dot(z, p, ix)
        ctx.save_for_backward(logits, probs, lse, *(() if index is None else (index,)))
        ctx.sparse = index is not None
        ctx.chunk_elements = chunk_elements
        return ce

    @staticmethod
    def backward(ctx, grad_ce):
        logits, probs, lse, *rest = ctx.saved_tensors
        index = rest[0] if ctx.sparse else None
        grad = torch.empty_like(logits)
        for part in position_chunks(logits.shape, ctx.chunk_elements):
            g = grad_ce[:, part].float().unsqueeze(-1)  # [B, l, 1]
            p = probs[:, part]
            softmax = torch.exp(logits[:, part].float() - lse[:, part].unsqueeze(-1))  # [B, l, Vd]
            dz = softmax * (p.sum(-1, keepdim=True) * g)
            if index is None:
                dz -= p * g
            else:
                dz.scatter_add_(-1, index[:, part], -(p * g))
            grad[:, part] = dz.to(grad.dtype)
        return grad, None, None, None


# ---- the objective ---------------------------------------------------------------------------------


def objective_loss(
    logits: torch.Tensor, teacher: Teacher, trained: torch.Tensor, *, objective: str = "soft-ce", soft_ce: str = "plain"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position loss and soft CE [B, L] (fp32) of `logits` [B, L, Vd] against `teacher`.

    trained: [B, L] bool, the positions the loss counts (lk-hybrid's weight is their mean acceptance).
    objective: soft-ce (the loss is the soft CE, by the `soft_ce` kernel), lk-alpha or lk-hybrid (the
    module docstring; plain formulas only).
    """
    if objective == "soft-ce":
        ce = soft_cross_entropy(logits, teacher, soft_ce=soft_ce)
        return ce, ce
    if objective not in OBJECTIVES:
        raise EaglekitError(f"unknown objective {objective!r}", hint=f"use one of {', '.join(OBJECTIVES)}")
    if soft_ce != "plain":
        raise EaglekitError(f"--objective {objective} runs no --soft-ce {soft_ce}", hint="drop --soft-ce")
    if objective == "lk-alpha":
        # softmax alone keeps one fp32 [B, L, Vd] tensor for the backward, as the plain soft CE does;
        # the soft CE is only a metric here.
        alpha = teacher.acceptance(torch.softmax(logits, -1, dtype=torch.float32))
        with torch.no_grad():
            ce = plain_soft_cross_entropy(logits, teacher)
        return -torch.log(alpha.clamp(min=ALPHA_FLOOR)), ce
    log_q = torch.log_softmax(logits, -1, dtype=torch.float32)  # lk-hybrid: both terms take gradients
    ce = teacher.cross_entropy(log_q)
    alpha = teacher.acceptance(log_q.exp())
    with torch.no_grad():
        mean_alpha = (alpha * trained).sum() / trained.sum().clamp(min=1)
        lam = torch.exp(-LK_ETA * mean_alpha)
    return lam * ce + (1 - lam) * (1 - alpha), ce


# ---- the TTT loss ---------------------------------------------------------------------------------


@dataclass
class StepOutput:
    loss: torch.Tensor  # scalar: sum_j w_j * sum(loss_j) / denominators_j (loss_j: the objective's)
    stats: torch.Tensor  # [ttt_steps, len(STATS)] float64 sums (all-reducible; eaglekit.metrics)


def step_masks(loss_mask: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
    """Mask of counted positions for each step, aligned with `ttt_unroll` (step j: [B, L-j])."""
    counted = counted_positions(loss_mask)
    return [counted[:, 1 + j :] for j in range(ttt_steps)]


def step_counts(loss_mask: torch.Tensor, ttt_steps: int) -> torch.Tensor:
    """[ttt_steps] float64: how many positions each step counts (the loss denominators)."""
    return torch.stack([m.sum() for m in step_masks(loss_mask, ttt_steps)]).double()


def every_position(B: int, L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, positions) [B*L] of the whole [B, L] grid, in `reshape` order."""
    rows = torch.arange(B, device=device).repeat_interleave(L)
    return rows, torch.arange(L, device=device).repeat(B)


def step_index(j: int, device) -> torch.Tensor:
    """TTT step j as a 0-d tensor: compiled step functions then serve every j with one graph (an int
    argument would be specialized, 0 and 1 always)."""
    return torch.full((), j, dtype=torch.long, device=device)


def ttt_loss(
    logits: list[torch.Tensor],
    batch: Batch,
    d2t: torch.Tensor,
    t2d: torch.Tensor,
    *,
    weights: list[float],
    denominators: torch.Tensor,
    walk: bool = False,
    soft_ce: str = "plain",
    objective: str = "soft-ce",
    positions: tuple[torch.Tensor, torch.Tensor] | None = None,
    steps=None,
) -> StepOutput:
    """Loss and metric sums of one unrolled batch.

    Args:
        logits: `ttt_unroll` output: [N, Vd] a step at `positions`, or [B, L, Vd] (positions None).
        batch: the raw batch.
        d2t: [Vd] offsets, t2d: [V] bool (the draft's vocab buffers).
        weights: per-step loss weights (decay**j).
        denominators: [ttt_steps] counted positions of the whole optimizer step (all micro-batches
            and ranks), so accumulation and DDP give the loss of one big batch (lk-hybrid: but for its weight,
            which each micro-batch takes from its own acceptance).
        walk: also replay greedy chain decoding (`metrics.serving_walk`; validation only, it syncs to the CPU).
        soft_ce: plain, fused or compiled (`soft_cross_entropy`).
        objective: soft-ce, lk-alpha or lk-hybrid (`objective_loss`).
        positions: (rows, positions) [N] of the logits (`ttt.ttt_positions`, which must hold every
            counted one); None: the whole grid.
        steps: the step functions (`ttt.EAGER_STEPS` or `ttt.compiled_steps()`, whose `score` runs the
            plain soft CE, and the objective given here); None: `score_step` eagerly.
    """
    score = score_step if steps is None else steps.score
    if positions is None:
        B, L = logits[0].shape[:2]
        positions = every_position(B, L, logits[0].device)
        logits = [x.reshape(B * L, -1) for x in logits]
    rows, pos = positions  # [N] each
    counted = counted_positions(batch.loss_mask)  # [B, T]
    T = counted.shape[1]
    device = batch.input_ids.device
    stats = torch.zeros(len(logits), len(STATS), dtype=torch.float64, device=device)
    loss = batch.aux.new_zeros((), dtype=torch.float32)
    run = torch.zeros(rows.shape, dtype=torch.long, device=device)  # [N]
    chain = torch.ones(rows.shape, dtype=torch.bool, device=device)  # step 0 follows no miss
    for j, step_logits in enumerate(logits):  # [N, Vd]
        loss_sum, chain, run, stats[j, :7] = score(
            step_logits,
            counted,
            batch.teacher,
            batch.input_ids,
            rows,
            pos,
            step_index(j, device),
            d2t,
            t2d,
            chain,
            run,
            soft_ce=soft_ce,
            objective=objective,
        )
        loss = loss + weights[j] * loss_sum / denominators[j].clamp(min=1).float()
    if walk:  # row j: a served chain of j + 1 drafts
        grid = torch.zeros(counted.shape[0], T - 1, dtype=torch.long, device=device)
        grid[rows, pos] = run
        walks = serving_walks(counted[:, 1:], grid, list(range(1, len(logits) + 1)))
        for j, (tokens, cycles) in enumerate(walks):
            stats[j, 7], stats[j, 8] = tokens, cycles
    return StepOutput(loss=loss, stats=stats)


def score_step(
    step_logits,
    counted,
    teacher: Teacher,
    input_ids,
    rows,
    pos,
    j,
    d2t,
    t2d,
    chain,
    run,
    soft_ce: str = "plain",
    objective: str = "soft-ce",
):
    """Step j's loss sum and metric sums at `positions` (rows, pos [N]); j: 0-d long tensor.

    Args:
        step_logits: [N, Vd]. counted: [B, T] `counted_positions`. teacher: the batch's, [B, T, ...].
        chain: [N] bool, every step before j was right (all True for step 0). run: [N] long, leading
            correct steps so far.

    Returns:
        loss_sum (scalar fp32, the objective's loss summed over the trained positions), chain, run,
        and the metric sums [7] float64 (`STATS`' first seven; their loss_sum is the soft CE's).
    """
    T = counted.shape[1]
    raw = pos + 1 + j  # the raw position whose p step j predicts
    inside = raw < T
    raw = raw.clamp(max=T - 1)
    mask = counted[rows, raw] & inside  # [N]
    target = teacher.at(rows, raw)  # [1, N, ...]
    in_vocab = t2d[target.argmax[0]]
    trained = mask & in_vocab
    loss, ce = objective_loss(step_logits.unsqueeze(0), target, trained[None], objective=objective, soft_ce=soft_ce)
    loss_sum = (loss[0] * trained).sum()  # loss [1, N] fp32
    ce_sum = loss_sum if objective == "soft-ce" else (ce[0] * trained).sum()
    with torch.no_grad():
        guess = step_logits.argmax(-1)  # = argmax of log q
        correct = (guess + d2t[guess]) == target.argmax[0]  # compared in target ids
        prev = chain & mask
        chain = prev & correct
        run = run + chain
        # Is the data the target's own greedy output? (next raw token == target argmax)
        following = torch.where(raw + 1 < T, input_ids[rows, (raw + 1).clamp(max=T - 1)], -1)
        agree = (following == target.argmax[0]) & mask
        sums = torch.stack(
            [mask.sum(), (correct & mask).sum(), chain.sum(), prev.sum(), ce_sum.detach(), trained.sum(), agree.sum()]
        ).double()
    return loss_sum, chain, run, sums
