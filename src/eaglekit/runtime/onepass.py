"""Attention of a few query rows in one kernel: scores, softmax and weighted sum in one pass.

At batch 1 a decode step, a draft step and a verify are launch-bound, and Inductor writes a few-row
attention as three kernels (the scores, the softmax, the weighted sum: three reductions over
different axes). This Triton kernel does all three with an online softmax (running max and sum),
one program per (batch row, kv head) over the query rows that share the head, and skips the blocks
of slots that no query row may see (a short context in a long cache reads only its own slots).

It runs where Triton runs (CUDA, or `TRITON_INTERPRET=1` on a CPU for tests); `kv.attend_onepass`
takes the matmul form elsewhere. It is a custom op (`torch.library.triton_op`), so torch.compile
traces one call and Inductor inlines the kernel into the step; CUDA graphs capture it like any other.
"""

from __future__ import annotations

import os

import torch

try:  # triton comes with torch's CUDA wheels, not with CPU-only installs
    import triton
    import triton.language as tl
except ImportError:
    triton = None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read by triton at import, so read once here too


if triton is not None:

    @triton.jit
    def _onepass(
        q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr,
        R, L,
        sq_b, sq_h, sq_r, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sm_b, sm_r, so_b, so_h, so_r,
        # SCALE is a constexpr: a float argument reaches Inductor's launch as fp64 and makes p·v a mixed-dtype dot
        HEADS: tl.constexpr, D: tl.constexpr, SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr,
    ):  # fmt: skip
        b, h = tl.program_id(0) // HEADS, tl.program_id(0) % HEADS
        rows, dims = tl.arange(0, BLOCK_R), tl.arange(0, D)
        live = rows < R
        q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_r + dims[None, :], mask=live[:, None], other=0.0)
        q = q.to(tl.float32)  # both dots in fp32, as the reduce form computes them
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)  # running max of each row's scores
        s_sum = tl.zeros([BLOCK_R], tl.float32)  # running sum of exp(score - m)
        acc = tl.zeros([BLOCK_R, D], tl.float32)  # running sum of exp(score - m) * v
        for start in range(0, L, BLOCK_L):
            slots = start + tl.arange(0, BLOCK_L)
            inside = slots < L
            seen = (
                tl.load(
                    mask_ptr + b * sm_b + rows[:, None] * sm_r + slots[None, :],
                    mask=live[:, None] & inside[None, :],
                    other=0,
                )
                != 0
            )  # [BLOCK_R, BLOCK_L]
            if tl.max(seen.to(tl.int32)) > 0:  # a block no row sees is not read
                k = tl.load(
                    k_ptr + b * sk_b + h * sk_h + slots[:, None] * sk_l + dims[None, :], mask=inside[:, None], other=0.0
                )
                scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * SCALE  # [BLOCK_R, BLOCK_L]
                scores = tl.where(seen, scores, float("-inf"))
                m_new = tl.maximum(m, tl.max(scores, 1))
                base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet stay at 0
                p = tl.exp(scores - base[:, None])
                keep = tl.exp(m - base)
                v = tl.load(
                    v_ptr + b * sv_b + h * sv_h + slots[:, None] * sv_l + dims[None, :], mask=inside[:, None], other=0.0
                )
                s_sum = s_sum * keep + tl.sum(p, 1)
                acc = acc * keep[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
                m = m_new
        out = acc / tl.where(s_sum == 0.0, 1.0, s_sum)[:, None]  # a row that sees no slot: zeros
        tl.store(out_ptr + b * so_b + h * so_h + rows[:, None] * so_r + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=live[:, None])  # fmt: skip

    @torch.library.triton_op("eaglekit::onepass_attention", mutates_args=())
    def _onepass_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, h, R, d = q.shape
        out = torch.empty_like(q)
        kernel = torch.library.wrap_triton(_onepass)
        kernel[(B * h,)](
            q, k, v, mask, out,
            R, k.shape[-2],
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            HEADS=h, D=d, SCALE=d ** -0.5, BLOCK_R=max(16, 1 << (R - 1).bit_length()), BLOCK_L=64,
        )  # fmt: skip
        return out


def onepass_runs(q: torch.Tensor) -> bool:
    """Whether the kernel runs for q: Triton is installed and q is on CUDA, or Triton's interpreter is on."""
    return triton is not None and (q.is_cuda or INTERPRETED)


def onepass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, h, R, d], k/v [B, h, L, d], mask [B|1, 1, R, L] bool (True = attend) -> [B, h, R, d].

    R (the kv head's query rows: heads per kv head x tokens) is padded to a power of two of at least
    16 for the kernel's dot products; d must be a power of two of at least 16 (64, 128). A custom op
    (`torch.library.triton_op`): torch.compile sees one opaque call, Inductor still inlines the kernel."""
    q, k, v, mask = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, mask))
    return torch.ops.eaglekit.onepass_attention(q, k, v, mask)
