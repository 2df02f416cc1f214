"""Which kernels run a target's or a draft's forward, and the small-row forms they choose between.

A batch-1 step of a small model is bound by kernel launches, not by bandwidth: there Inductor's own
reductions (the "reduce" attention and the `matvec` linears, fused with their neighbours) beat cuBLAS
and SDPA; a large model or a batch keeps cuBLAS and SDPA. A forward of a few rows on a CPU takes
whichever of two BLAS forms the machine runs faster, timed once per process. The measurements behind
each choice: docs/notes/engine.md, "Kernels".

Shapes: R rows (tokens of one forward), K input features, N output features, I SwiGLU width.
"""

from __future__ import annotations

import functools
import logging
import time

import torch
import torch.nn.functional as F

from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)

LAUNCH_BOUND_BYTES = 2 * 2**30  # below this many weight bytes a batch-1 step is kernel launches, not bandwidth
# Forwards of at most this many tokens use the fused forms: with more rows each row re-reads the
# weights (the draft's 32k-row head the most), and cuBLAS with matmul attention wins.
SMALL_ROWS = 1
# The most rows `matvec` unrolls: Inductor fuses a node group of at most 64 (max_fusion_size), and a
# 16-row SwiGLU is 32 reductions; past it a layer falls apart into many more kernels.
MATVEC_MAX_ROWS = 16
# Eager CPU forwards of at most this many rows may use `few_rows_linear` (where it times faster).
CPU_FEW_ROWS = 64


def default_kernels(batch_size: int, weight_bytes: int) -> tuple[str, bool]:
    """(attention kind, matvec) measured fastest for the shape.

    A small model at batch 1 is launch-bound: "reduce" attention with `matvec` linears. A large model
    at batch 1 is bandwidth-bound, and batched generation is compute-heavier: both keep SDPA and
    cuBLAS. The fused forms apply to forwards of at most `small_rows` tokens (a decode step, a chain's
    verify, a draft step); larger ones (prefill, a big tree's verify) use matmul attention and cuBLAS.
    """
    if batch_size == 1 and weight_bytes < LAUNCH_BOUND_BYTES:
        return "reduce", True
    return "sdpa", False


def check_small_rows(small_rows: int) -> int:
    if not 1 <= small_rows <= MATVEC_MAX_ROWS:
        raise EaglekitError(
            f"small_rows={small_rows}: the matvec forms take 1 to {MATVEC_MAX_ROWS} rows",
            hint=f"keep small_rows <= {MATVEC_MAX_ROWS}; larger forwards use cuBLAS, and "
            "attention_rows raises the reduce attention's limit alone",
        )
    return small_rows


def kernel_for_rows(attention: str, rows: int, attention_rows: int) -> str:
    """The attention kind a forward of `rows` tokens uses: "reduce" only for forwards of at most
    `attention_rows` tokens (the broadcast form re-reads the cache for every query row), "matmul" above."""
    return "matmul" if attention == "reduce" and rows > attention_rows else attention


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, max_rows: int = 0) -> torch.Tensor:
    """x [..., K] -> [..., N] with weight [N, K]: `matvec_linear` inside torch.compile when x has at
    most `max_rows` rows (0 = never); for an eager CPU forward of a few rows (a decode step, a verify,
    a draft step, a small batch) whichever of `few_rows_linear` and F.linear this CPU runs faster
    (`cpu_few_rows_faster`); else F.linear (prefill, large forwards)."""
    rows = x.numel() // x.shape[-1]
    if torch.compiler.is_compiling():
        return matvec_linear(x, weight, bias) if max_rows and rows <= max_rows else F.linear(x, weight, bias)
    if x.device.type == "cpu" and rows <= CPU_FEW_ROWS and cpu_few_rows_faster()[rows > 1]:
        return few_rows_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear as `weight @ x.T`, one row padded to two: on some CPUs' BLAS this streams W at full
    bandwidth where `x @ W.T` (F.linear) and the one-row gemv read it at a third to a half of it."""
    flat = x.reshape(-1, x.shape[-1])  # [R, K]
    rows = flat.shape[0]
    if rows == 1:
        flat = torch.cat([flat, flat])
    y = (weight @ flat.T).T[:rows]  # [R, N]
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


@functools.cache
def cpu_few_rows_faster() -> tuple[bool, bool]:
    """(for one row, for 2..CPU_FEW_ROWS rows): whether `few_rows_linear` beats F.linear on this CPU,
    timed once per process on 128 MB of fp32 weights (more than the caches hold, as a model's are).

    The answer depends on the machine (two 2-core hosts of one CPU family gave opposite answers), so it
    is measured, not assumed."""
    weights = [torch.full((4096, 2048), 0.5) for _ in range(4)]  # 4 x [N, K], 32 MB each
    timed = {}
    for rows in (1, 4):
        x = torch.full((rows, 2048), 0.25)
        for name, form in (("few", few_rows_linear), ("f.linear", F.linear)):
            best = float("inf")
            for _ in range(4):  # the first one warms up
                start = time.perf_counter()
                for w in weights:
                    form(x, w, None)
                best = min(best, time.perf_counter() - start)
            timed[rows, name] = best * 1e3
    choice = (timed[1, "few"] < timed[1, "f.linear"], timed[4, "few"] < timed[4, "f.linear"])
    log.info(
        "CPU linears of a few rows (timed on 128 MB, %d threads): one row %s (%.1f ms; the other %.1f), "
        "four rows %s (%.1f ms; the other %.1f)",
        torch.get_num_threads(),
        *describe(choice[0], timed[1, "few"], timed[1, "f.linear"]),
        *describe(choice[1], timed[4, "few"], timed[4, "f.linear"]),
    )
    return choice


def describe(few: bool, few_ms: float, linear_ms: float) -> tuple[str, float, float]:
    return ("weight @ x.T", few_ms, linear_ms) if few else ("F.linear", linear_ms, few_ms)


def matvec_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear as products and sums (float32), for `linear` inside torch.compile: Inductor generates
    the reduction kernel itself and fuses the neighbouring pointwise work into it (bias, residual
    add, the next RMSNorm), where cuBLAS would be one more launch of a latency-bound GEMV."""
    return matvec(x, [weight], [bias], lambda y: y.to(x.dtype))


def matvec_swiglu(x: torch.Tensor, w13: torch.Tensor, b13: torch.Tensor | None) -> torch.Tensor:
    """silu(gate) * up with gate and up ([I, K] each, concatenated in w13 [2I, K]) as two reductions
    of one shape, which Inductor fuses with the SwiGLU into one kernel."""
    inter = w13.shape[0] // 2
    return matvec(
        x,
        w13.split(inter),
        (None, None) if b13 is None else b13.split(inter),
        lambda gate, up: F.silu(gate.to(x.dtype)) * up.to(x.dtype),
    )


def project_by_heads(rows: int, head_dim: int) -> bool:
    """Whether a one-sequence forward of `rows` tokens takes `output_projection`: inside torch.compile,
    at most head_dim / 4 rows, so that its partial outputs stay within a quarter of the weight's bytes."""
    return torch.compiler.is_compiling() and rows <= head_dim // 4


def output_projection(out: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One sequence's attention output out [heads, T, d] times the output projection's weight
    [N, heads * d] -> [T, N] as one batched matmul over the heads, whose partial outputs [heads, T, N]
    are summed by adds that Inductor fuses into the next kernel (the residual add and the norm). The
    usual form first copies the heads side by side for one mm, a launch of its own. The partials are
    rounded to the dtype before the sum, as a tensor-parallel output projection's are."""
    heads, T, d = out.shape
    partial = torch.matmul(out, weight.view(-1, heads, d).permute(1, 2, 0))  # [heads, T, N]
    y = partial[0]
    for h in range(1, heads):
        y = y + partial[h]
    return y if bias is None else y + bias


def matvec(x: torch.Tensor, weights, biases, epilogue) -> torch.Tensor:
    """epilogue(*[x @ w.T + b in float32]) as broadcast products and sums: x [..., K], each w [N, K].

    One row: one reduction per weight. A few rows (a chain's verify, a tree level, a catch-up): the
    same per row, the epilogue applied to each row, then the rows stacked, so Inductor fuses the R
    reductions into one kernel that reads W once for all of them (one broadcast over [R, N, K] made
    every row re-read W). Under dynamic shapes the row count is symbolic and the broadcast form stays."""

    def reduced(v):  # [..., K] -> epilogue(*[..., N])
        ys = [(v.unsqueeze(-2).float() * w.float()).sum(-1) for w in weights]
        return epilogue(*[y if b is None else y + b.float() for y, b in zip(ys, biases)])

    rows = x.numel() // x.shape[-1]
    if not (isinstance(rows, int) and rows > 1):
        return reduced(x)
    flat = x.reshape(rows, x.shape[-1])  # [R, K]
    out = torch.stack([reduced(flat[r]) for r in range(rows)])  # [R, N]
    return out.reshape(*x.shape[:-1], out.shape[-1])
