"""Soft cross-entropy of draft logits against the teacher, without an fp32 [tokens, Vd] copy per step.

-sum_v p(v) log q(v) = lse(z) * sum_v p(v) - sum_v p(v) z(v), with q = softmax(z). The plain form
(`log_softmax(z.float())`, then a product with p) materializes fp32 copies of the [B, L, Vd] logits
and autograd keeps the fp32 log-probabilities of all TTT steps for the backward (1 GiB a step at
16384 tokens x 16384 draft ids). `SoftCrossEntropy` keeps only the logits (in their own dtype, bf16
under autocast) and the [B, L] lse, works in fp32 on position chunks of bounded size, and
recomputes softmax(z) in the backward: dz = dce * (softmax(z) * sum p - p).
"""

from __future__ import annotations

import functools

import torch

from eaglekit.errors import EaglekitError
from eaglekit.features.teacher import Teacher

CHUNK_ELEMENTS = 2 ** 27   # fp32 working set per chunk: 512 MiB


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
        lse = logits.new_empty(logits.shape[:2], dtype=torch.float32)        # [B, L]
        ce = torch.empty_like(lse)
        for part in position_chunks(logits.shape, chunk_elements):
            z = logits[:, part].float()                                       # [B, l, Vd]
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
            g = grad_ce[:, part].float().unsqueeze(-1)                        # [B, l, 1]
            p = probs[:, part]
            softmax = torch.exp(logits[:, part].float() - lse[:, part].unsqueeze(-1))   # [B, l, Vd]
            dz = softmax * (p.sum(-1, keepdim=True) * g)
            if index is None:
                dz -= p * g
            else:
                dz.scatter_add_(-1, index[:, part], -(p * g))
            grad[:, part] = dz.to(grad.dtype)
        return grad, None, None, None


def plain_soft_cross_entropy(logits: torch.Tensor, teacher: Teacher) -> torch.Tensor:
    """Log-softmax, then the teacher's dot. `log_softmax(dtype=float32)` reads bf16 logits in one CUDA
    kernel (no fp32 copy first), and its backward writes bf16 again: about 10 passes over [N, Vd] a
    step, where lse(z) * sum p - p.z in eager took about 25 (logsumexp alone is four kernels, and its
    backward three more). Counted from the kernels, not yet timed."""
    return teacher.cross_entropy(torch.log_softmax(logits, -1, dtype=torch.float32))


@functools.cache
def compiled_soft_cross_entropy(backend: str = "inductor"):
    """`plain_soft_cross_entropy` under torch.compile, built once and dynamic in the positions:
    inductor fuses its forward and its backward into about one pass each over [N, Vd] (logits and
    teacher read, the gradient written), where eager makes about five each."""
    return torch.compile(plain_soft_cross_entropy, dynamic=True, backend=backend)


def soft_cross_entropy(logits: torch.Tensor, teacher: Teacher, *, soft_ce: str = "plain",
                       chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Per-position soft CE [B, L] (fp32) of `logits` [B, L, Vd] against `teacher` (same positions).

    soft_ce: "plain" (`plain_soft_cross_entropy`: what `train` runs, and what `train --compile`
    traces), "fused" (`SoftCrossEntropy`: keeps no fp32 log-probs for the backward) or "compiled"
    (`compiled_soft_cross_entropy`).
    """
    if soft_ce == "fused":
        return SoftCrossEntropy.apply(logits, teacher.probs, teacher.index, chunk_elements)
    if soft_ce == "compiled":
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):   # never eager unannounced
            return compiled_soft_cross_entropy()(logits, teacher)
    if soft_ce == "plain":
        return plain_soft_cross_entropy(logits, teacher)
    raise EaglekitError(f"unknown soft CE {soft_ce!r}", hint="use plain, fused or compiled")
