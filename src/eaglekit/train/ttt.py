"""Training-time test (TTT): the draft unrolled on its own outputs, as it runs when serving.

Alignment (EAGLE-3). Raw tokens x_0..x_{T-1}, target aux states g_t, target distributions p_t
(p_t predicts x_{t+1}). The draft works on L = T-1 positions t = 0..L-1:

    step 0, position t: token x_{t+1}, hidden fc(g_t),            rope position t,   predicts p_{t+1}
    step j, position t: token x_{t+1+j}, hidden = own step j-1 output at t, position t+j, predicts p_{t+1+j}

Ground-truth tokens are the inputs at every step (EAGLE-3): on data the target wrote greedily they
are exactly what the draft proposes whenever its earlier steps were right, which is the only case
that matters for acceptance. Attention at step j for position t sees the true prefix (step-0 keys
at positions 0..t) plus its own draft chain (keys of steps 1..j at position t), never another
position's chain: `ttt_attention` computes that from the step-0 scores with a causal mask plus j
diagonal terms, without a [T, jT] mask; `merged_ttt_attention` (train/attention.py, `--ttt-attention merged`)
computes the same without the [L, L] scores, through a causal flash kernel merged by log-sum-exp.

Loss at step j: soft cross-entropy against p restricted to the draft vocab, weight decay**j,
averaged over the counted positions. A position counts when both its input token and the token it
predicts were written by the assistant (the draft is only ever asked to continue an answer, and
never to predict past the end of turn). Positions whose target argmax is outside the draft vocab
get no loss (no draft can propose that token, and the renormalized teacher would teach a token the
target does not pick) but stay in the denominators of the metrics as misses, so acc_j and the
simulated accept length are what serving can reach.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eaglekit.errors import EaglekitError
from eaglekit.features.batch import Batch, counted_positions
from eaglekit.features.teacher import Teacher
from eaglekit.train.attention import merged_ttt_attention
from eaglekit.train.config import ATTENTIONS
from eaglekit.train.soft_ce import soft_cross_entropy

STATS = ("valid", "correct", "chain", "chain_prev", "loss_sum", "counted", "agree", "walk_tokens", "walk_cycles")


def dense_ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                  diag_k: list[torch.Tensor], diag_v: list[torch.Tensor]) -> torch.Tensor:
    """Attention of TTT step j = len(diag_k): causal over the step-0 keys plus each position's own chain.

    Args:
        q: [B, nh, L, hd] queries of step j (rope applied at positions t+j).
        k0, v0: [B, nkv, L, hd] step-0 keys/values (the true prefix).
        diag_k, diag_v: j tensors [B, nkv, L, hd]: keys/values of steps 1..j at the same position.

    Returns:
        [B, nh, L, hd]; position t mixes v0[:t+1] and diag_v[i][t] only.
    """
    B, nh, L, hd = q.shape
    nkv = k0.shape[1]
    qg = q.view(B, nkv, nh // nkv, L, hd)                                     # GQA: query groups per kv head
    scale = hd ** -0.5
    prefix = torch.matmul(qg, k0.unsqueeze(2).transpose(-1, -2)) * scale     # [B, nkv, g, L, L]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    prefix = prefix.masked_fill(~causal, float("-inf"))
    if diag_k:
        kd = torch.stack(diag_k, dim=-2)                                       # [B, nkv, L, j, hd]
        vd = torch.stack(diag_v, dim=-2)
        own = torch.einsum("bkgld,bkljd->bkglj", qg, kd) * scale               # [B, nkv, g, L, j]
        scores = torch.cat([prefix, own], dim=-1)                              # [B, nkv, g, L, L+j]
    else:
        scores = prefix
    weights = scores.float().softmax(-1).to(v0.dtype)
    out = torch.matmul(weights[..., :L], v0.unsqueeze(2))                     # [B, nkv, g, L, hd]
    if diag_k:
        out = out + torch.einsum("bkglj,bkljd->bkgld", weights[..., L:], vd)
    return out.reshape(B, nh, L, hd)


def ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag_k: list[torch.Tensor],
                  diag_v: list[torch.Tensor], attention: str = "dense") -> torch.Tensor:
    """TTT attention of step j = len(diag_k) (see `dense_ttt_attention`); `attention` picks the implementation."""
    if attention == "merged":
        return merged_ttt_attention(q, k0, v0, diag_k, diag_v)
    if attention == "dense":
        return dense_ttt_attention(q, k0, v0, diag_k, diag_v)
    raise EaglekitError(f"unknown TTT attention {attention!r}", hint=f"use one of {ATTENTIONS}")


def ttt_unroll(draft, aux: torch.Tensor, input_ids: torch.Tensor, ttt_steps: int,
               attention: str = "dense", positions: tuple[torch.Tensor, torch.Tensor] | None = None,
               steps: StepFunctions | None = None) -> list[torch.Tensor]:
    """Run the draft for `ttt_steps` steps; returns the logits of each step.

    Args:
        draft: an `Eagle3Draft`.
        aux: [B, T, k*Ht] raw target aux states.
        input_ids: [B, T] raw token ids.
        ttt_steps: unroll length.
        attention: "merged" (flash prefix + own chain, no [L, L] scores; the default) or "dense" (the reference).
        positions: (rows, positions) [N] from `ttt_positions`. Step 0 runs on the whole grid (its keys
            are every later step's prefix); steps 1.. and the head run at these positions only.
        steps: the step functions (`EAGER_STEPS`, or `compiled_steps()`); with `positions` only.

    Returns:
        ttt_steps tensors [B, L, Vd] (L = T-1), or [N, Vd] at `positions`: step j, position t
        predicts p_{t+1+j}; positions t >= L-j read padding and are never counted.
    """
    if positions is None:
        hidden = draft.fuse(aux[:, :-1])                                      # [B, L, H]: g_t
        tokens = input_ids[:, 1:]                                             # [B, L]: x_{t+1}
        B, L = tokens.shape
        grid = torch.arange(L, device=tokens.device).expand(B, L)
        q, k0, v0, residual = draft.attention_pieces(tokens, hidden, grid)   # step 0: the true prefix
        hidden = draft.finish(ttt_attention(q, k0, v0, [], [], attention), residual)   # [B, L, H], pre-norm
        return [draft.logits(hidden)] + grid_steps(draft, hidden, tokens, grid, k0, v0, ttt_steps, attention)
    steps = steps or EAGER_STEPS
    rows, pos = positions
    first_logits, hidden, k0, v0 = steps.first(draft, aux, input_ids, rows, pos, attention)
    logits = [first_logits]                                                   # [N, Vd] a step
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    for j in range(1, ttt_steps):
        q, k, v, residual = steps.project(draft, hidden, input_ids, rows, pos, step_index(j, pos.device))
        diag_k.append(k)
        diag_v.append(v)
        # The attention runs on the [B, L] grid (the prefix kernel wants it); the rows outside
        # `positions` hold zeros there, and their outputs are dropped, so they get no gradient.
        attended = ttt_attention(q, k0, v0, diag_k, diag_v, attention)
        hidden, step_logits = steps.finish(draft, attended, rows, pos, residual)
        logits.append(step_logits)
    return logits


def step_index(j: int, device) -> torch.Tensor:
    """TTT step j as a 0-d tensor: compiled step functions then serve every j with one graph (an int
    argument would be specialized, 0 and 1 always)."""
    return torch.full((), j, dtype=torch.long, device=device)


def first_step(draft, aux, input_ids, rows, pos, attention: str):
    """Step 0 on the whole grid, its hidden state and head at `positions` only.

    Returns: logits [N, Vd], hidden [N, H] (pre-norm), k0 / v0 [B, nkv, L, hd] (the true prefix).
    """
    hidden = draft.fuse(aux[:, :-1])                                          # [B, L, H]: g_t
    tokens = input_ids[:, 1:]                                                 # [B, L]: x_{t+1}
    B, L = tokens.shape
    grid = torch.arange(L, device=tokens.device).expand(B, L)
    q, k0, v0, residual = draft.attention_pieces(tokens, hidden, grid)
    hidden = draft.finish(ttt_attention(q, k0, v0, [], [], attention), residual)[rows, pos]   # [N, H]
    return draft.logits(hidden), hidden, k0, v0


def project_step(draft, hidden, input_ids, rows, pos, j):
    """Step j's rotated q/k/v at `positions` (token x_{t+1+j}, 0 past the end; rope position t+j), on the
    [B, L] grid (`to_grid`), and its residual [1, N, H]. j: 0-d long tensor."""
    tokens = input_ids[:, 1:]                                                 # [B, L]
    B, L = tokens.shape
    at = pos + j                                                              # [N]
    ahead = torch.where(at < L, tokens[rows, at.clamp(max=L - 1)], 0)
    q, k, v, residual = draft.attention_pieces(ahead[None], hidden[None], at[None])
    grid = (rows, pos)
    return to_grid(q, grid, B, L), to_grid(k, grid, B, L), to_grid(v, grid, B, L), residual


def finish_step(draft, attended, rows, pos, residual):
    """Step j's attention output [B, nh, L, hd] at `positions` -> (hidden [N, H], logits [N, Vd])."""
    hidden = draft.finish(attended[rows, :, pos].transpose(0, 1)[None], residual)[0]
    # A tensor of its own, as step 0's is, not a view of [1, N, H]: the next step's compiled graphs
    # would guard on the base's layout and compile once more for step 2.
    hidden = hidden.clone()
    return hidden, draft.logits(hidden)


def grid_steps(draft, hidden, tokens, grid, k0, v0, ttt_steps: int, attention: str) -> list[torch.Tensor]:
    """Steps 1.. of `ttt_unroll` on the whole [B, L] grid (the reference): their [B, L, Vd] logits.
    grid: [B, L] step 0's rope positions."""
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    logits = []
    for j in range(1, ttt_steps):
        q, k, v, residual = draft.attention_pieces(F.pad(tokens[:, j:], (0, j)), hidden, grid + j)
        diag_k.append(k)
        diag_v.append(v)
        hidden = draft.finish(ttt_attention(q, k0, v0, diag_k, diag_v, attention), residual)
        logits.append(draft.logits(hidden))
    return logits


def to_grid(x: torch.Tensor, positions: tuple[torch.Tensor, torch.Tensor], B: int, L: int) -> torch.Tensor:
    """[1, heads, N, hd] at `positions` -> [B, heads, L, hd], zeros elsewhere."""
    rows, pos = positions
    out = x.new_zeros(B, x.shape[1], L, x.shape[-1])
    out[rows, :, pos] = x[0].transpose(0, 1)                                  # [N, heads, hd]
    return out


def ttt_positions(loss_mask: torch.Tensor, ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, positions) [N]: the draft positions t that some step j < ttt_steps counts (counted[t+1+j]).

    The head and the loss need only these: the prompt, the padding and what follows the last answer
    are a third or more of a packed batch, and the [N, Vd] logits are contiguous (a slice along the
    positions of [B, L, Vd] is not, and its elementwise kernels run strided). One host sync.
    """
    counted = counted_positions(loss_mask)                                   # [B, T]
    L = counted.shape[1] - 1
    ahead = F.pad(counted, (0, ttt_steps), value=False)                      # [B, T + ttt_steps]
    wanted = torch.zeros_like(counted[:, :L])
    for j in range(ttt_steps):
        wanted |= ahead[:, 1 + j:1 + j + L]
    found = wanted.nonzero()                                                 # [N, 2]
    # Two tensors of their own, not views of one: a compiled step would guard on the shared base's sizes.
    return found[:, 0].contiguous(), found[:, 1].contiguous()


def every_position(B: int, L: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, positions) [B*L] of the whole [B, L] grid, in `reshape` order."""
    rows = torch.arange(B, device=device).repeat_interleave(L)
    return rows, torch.arange(L, device=device).repeat(B)


def step_masks(loss_mask: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
    """Mask of counted positions for each step, aligned with `ttt_unroll` (step j: [B, L-j])."""
    counted = counted_positions(loss_mask)
    return [counted[:, 1 + j:] for j in range(ttt_steps)]


def step_counts(loss_mask: torch.Tensor, ttt_steps: int) -> torch.Tensor:
    """[ttt_steps] float64: how many positions each step counts (the loss denominators)."""
    return torch.stack([m.sum() for m in step_masks(loss_mask, ttt_steps)]).double()


@dataclass
class StepOutput:
    loss: torch.Tensor          # scalar: sum_j w_j * sum(ce_j) / denominators_j
    stats: torch.Tensor         # [ttt_steps, len(STATS)] float64 sums (all-reducible)


def serving_walk(start_mask: torch.Tensor, run: torch.Tensor, max_drafts: int | None = None) -> tuple[int, int]:
    """Replay greedy chain decoding over the data: (tokens committed, target forwards).

    A cycle that starts at draft position t (last committed token x_{t+1}) accepts the run[t]
    leading correct drafts (at most `max_drafts`: the serving chain's k) plus one token from the
    target, so the next cycle starts at t + run[t] + 1. Walking every assistant span this way
    weights positions as serving does (hard stretches produce more cycles), which the per-position
    average 1 + sum_j prod cond_j does not.

    Args:
        start_mask: [B, L] bool, step-0 counted positions (the spans the draft is asked to continue).
        run: [B, L] int, leading correct steps of each position's chain (0..ttt_steps).
        max_drafts: the chain length k served (None: ttt_steps).
    """
    return serving_walks(start_mask, run, [max_drafts])[0]


def serving_walks(start_mask: torch.Tensor, run: torch.Tensor,
                  max_drafts: list[int | None]) -> list[tuple[int, int]]:
    """`serving_walk` for several served chain lengths, reading the tensors to the host once."""
    rows = list(zip(start_mask.cpu().tolist(), run.cpu().tolist()))
    return [walk_rows(rows, k) for k in max_drafts]


def walk_rows(rows: list[tuple[list[bool], list[int]]], max_drafts: int | None) -> tuple[int, int]:
    tokens = cycles = 0
    for mask_row, run_row in rows:
        t, L = 0, len(mask_row)
        while t < L:
            if not mask_row[t]:
                t += 1
                continue
            end = t
            while end < L and mask_row[end]:
                end += 1
            while t < end:                      # one assistant span
                n = run_row[t] if max_drafts is None else min(run_row[t], max_drafts)
                tokens += n + 1
                cycles += 1
                t += n + 1
            t = max(t, end)
    return tokens, cycles


def ttt_loss(logits: list[torch.Tensor], batch: Batch, d2t: torch.Tensor, t2d: torch.Tensor, *,
             weights: list[float], denominators: torch.Tensor, walk: bool = False,
             soft_ce: str = "plain", positions: tuple[torch.Tensor, torch.Tensor] | None = None,
             steps: StepFunctions | None = None) -> StepOutput:
    """Loss and metric sums of one unrolled batch.

    Args:
        logits: `ttt_unroll` output: [B, L, Vd] a step, or [N, Vd] at `positions`.
        batch: the raw batch.
        d2t: [Vd] offsets, t2d: [V] bool (the draft's vocab buffers).
        weights: per-step loss weights (decay**j).
        denominators: [ttt_steps] counted positions of the whole optimizer step (all micro-batches
            and ranks), so accumulation and DDP give the loss of one big batch.
        walk: also replay greedy chain decoding (`serving_walk`; validation only, it syncs to the CPU).
        soft_ce: plain, fused or compiled (`soft_cross_entropy`).
        positions: (rows, positions) [N] of the logits (`ttt_positions`, which must hold every
            counted one); None: the whole grid.
        steps: the step functions (`EAGER_STEPS`, or `compiled_steps()`, which run the plain soft CE).
    """
    steps = steps or EAGER_STEPS
    if positions is None:
        B, L = logits[0].shape[:2]
        positions = every_position(B, L, logits[0].device)
        logits = [x.reshape(B * L, -1) for x in logits]
    rows, pos = positions                                                     # [N] each
    counted = counted_positions(batch.loss_mask)                              # [B, T]
    T = counted.shape[1]
    device = batch.input_ids.device
    stats = torch.zeros(len(logits), len(STATS), dtype=torch.float64, device=device)
    loss = batch.aux.new_zeros((), dtype=torch.float32)
    run = torch.zeros(rows.shape, dtype=torch.long, device=device)            # [N]
    chain = torch.ones(rows.shape, dtype=torch.bool, device=device)          # step 0 follows no miss
    for j, step_logits in enumerate(logits):                                   # [N, Vd]
        ce_sum, chain, run, stats[j, :7] = steps.score(step_logits, counted, batch.teacher, batch.input_ids, rows,
                                                       pos, step_index(j, device), d2t, t2d, chain, run, soft_ce=soft_ce)
        loss = loss + weights[j] * ce_sum / denominators[j].clamp(min=1).float()
    if walk:                                     # row j: a served chain of j + 1 drafts
        grid = torch.zeros(counted.shape[0], T - 1, dtype=torch.long, device=device)
        grid[rows, pos] = run
        walks = serving_walks(counted[:, 1:], grid, list(range(1, len(logits) + 1)))
        for j, (tokens, cycles) in enumerate(walks):
            stats[j, 7], stats[j, 8] = tokens, cycles
    return StepOutput(loss=loss, stats=stats)


def score_step(step_logits, counted, teacher: Teacher, input_ids, rows, pos, j, d2t, t2d, chain, run,
               soft_ce: str = "plain"):
    """Step j's loss sum and metric sums at `positions` (rows, pos [N]); j: 0-d long tensor.

    Args:
        step_logits: [N, Vd]. counted: [B, T] `counted_positions`. teacher: the batch's, [B, T, ...].
        chain: [N] bool, every step before j was right (all True for step 0). run: [N] long, leading
            correct steps so far.

    Returns:
        ce_sum (scalar fp32, the soft CE summed over the trained positions), chain, run, and the
        metric sums [7] float64 (`STATS`' first seven).
    """
    T = counted.shape[1]
    raw = pos + 1 + j                                                          # the raw position whose p step j predicts
    inside = raw < T
    raw = raw.clamp(max=T - 1)
    mask = counted[rows, raw] & inside                                         # [N]
    target = teacher.at(rows, raw)                                             # [1, N, ...]
    in_vocab = t2d[target.argmax[0]]
    ce = soft_cross_entropy(step_logits.unsqueeze(0), target, soft_ce=soft_ce)[0]   # [N] fp32
    trained = mask & in_vocab
    ce_sum = (ce * trained).sum()
    with torch.no_grad():
        guess = step_logits.argmax(-1)                                         # = argmax of log q
        correct = (guess + d2t[guess]) == target.argmax[0]                     # compared in target ids
        prev = chain & mask
        chain = prev & correct
        run = run + chain
        # Is the data the target's own greedy output? (next raw token == target argmax)
        following = torch.where(raw + 1 < T, input_ids[rows, (raw + 1).clamp(max=T - 1)], -1)
        agree = (following == target.argmax[0]) & mask
        sums = torch.stack([mask.sum(), (correct & mask).sum(), chain.sum(), prev.sum(), ce_sum.detach(),
                            trained.sum(), agree.sum()]).double()
    return ce_sum, chain, run, sums


@dataclass(frozen=True)
class StepFunctions:
    """What one TTT step runs, as four functions: `ttt_unroll` calls `first` once and `project` and
    `finish` for each later step, `ttt_loss` calls `score` for every step. Eager (`EAGER_STEPS`), or
    each under torch.compile (`compiled_steps`): every TTT step then shares four graphs, so a compile
    traces and lowers one step's work, not the unroll's (the whole unroll + loss as one graph took
    198 s to compile on an H200, 2026-12-04). The merged attention of steps 1.. runs eagerly between
    them. Dynamo specializes a size of 1, so a one-row batch would compile all four again: the
    compiled loss gives such a batch an empty second row (`train.loop.with_empty_row`)."""

    first: Callable
    project: Callable
    finish: Callable
    score: Callable


EAGER_STEPS = StepFunctions(first_step, project_step, finish_step, score_step)
# Inductor's coalescing analysis for tiling (tiling_utils) raised an AssertionError in codegen on the
# unroll with torch 2.11 on an H200 (2026-12-01, `get_pw_red_splits`); without it inductor tiles as before.
COMPILE_OPTIONS = {"triton.coalesce_tiling_analysis": False}


@contextlib.contextmanager
def compile_guards():
    """Where compiled training code runs: dynamo's recompile limit raises instead of running eagerly
    unannounced, and no duck sizing (two sizes equal in one batch, rows and N say, must not become one
    symbol, or the next batch compiles again)."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), \
            torch.fx.experimental._config.patch(use_duck_shape=False):
        yield


@functools.cache
def compiled_steps(backend: str = "inductor") -> StepFunctions:
    """`EAGER_STEPS` under torch.compile, dynamic in the batch's sizes, the plain soft CE (inductor fuses
    it itself). A shape that would recompile past dynamo's limit raises instead of running eagerly."""
    def compiled(fn, **fixed):
        graph = torch.compile(fn, dynamic=True, backend=backend,
                              options=COMPILE_OPTIONS if backend == "inductor" else None)

        @functools.wraps(fn)
        def run(*args, **kw):
            with compile_guards():
                return graph(*args, **{**kw, **fixed})
        return run

    return StepFunctions(compiled(first_step), compiled(project_step), compiled(finish_step),
                         compiled(score_step, soft_ce="plain"))


def cumulative_acceptance(cond: list[float]) -> list[float]:
    """P(the first j+1 drafts are all accepted) from per-step conditional acceptance: the running
    products; 1 + their sum over the first k steps is the accept length a chain of k is predicted."""
    running, out = 1.0, []
    for c in cond:
        running *= float(c)
        out.append(running)
    return out


def metrics_from_stats(stats: torch.Tensor) -> dict:
    """Per-step acc_j, conditional acceptance, cumulative acceptance and the simulated accept length.

    acc_j   = correct_j / valid_j (unconditional)
    cond_j  = P(step j correct | steps 0..j-1 correct)
    tau     = 1 + sum_j prod_{i<=j} cond_i (tokens per target forward with a chain of ttt_steps drafts)
    walk_accept_length: tokens per target forward when greedy chain decoding is replayed over the
        data (`serving_walk`; validation only): what an engine measures on these prompts.
    walk_accept_length_by_k: the same for a served chain of k = 1 .. ttt_steps drafts (the per-step
        estimate 1 + sum prod cond over-predicts a served chain: it weights positions evenly).
    data_greedy_agreement: share of counted positions whose next token in the data is the target's
        argmax; near 1 on data the target regenerated greedily, low on data written by someone else
        (then acc_j, measured against the target, and ground-truth-token baselines diverge).
    """
    s = stats.double().cpu()
    col = {name: s[:, i] for i, name in enumerate(STATS)}
    walks = [round(float(t) / float(c), 5) for t, c in zip(col["walk_tokens"], col["walk_cycles"]) if float(c) > 0]
    acc = (col["correct"] / col["valid"].clamp(min=1)).tolist()
    cond = (col["chain"] / col["chain_prev"].clamp(min=1)).tolist()
    cumulative = cumulative_acceptance(cond)
    tau = 1.0 + sum(cumulative)
    return {"acc": [round(a, 5) for a in acc], "cond_acc": [round(c, 5) for c in cond],
            "cum_acc": [round(c, 5) for c in cumulative], "sim_accept_length": round(tau, 5),
            "ce": [round(x, 5) for x in (col["loss_sum"] / col["counted"].clamp(min=1)).tolist()],
            "positions": int(col["valid"][0]),
            "data_greedy_agreement": round(float(col["agree"][0]) / max(float(col["valid"][0]), 1.0), 5),
            "walk_accept_length": walks[-1] if walks else None,
            "walk_accept_length_by_k": walks or None,
            "oov_share": round(1 - float(col["counted"][0]) / max(float(col["valid"][0]), 1.0), 5)}
