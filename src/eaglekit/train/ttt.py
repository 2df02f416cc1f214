"""Training-time test (TTT): the draft unrolled on its own outputs, as it runs when serving.

Alignment (EAGLE-3). Raw tokens x_0..x_{T-1}, target aux states g_t, target distributions p_t
(p_t predicts x_{t+1}). The draft works on L = T-1 positions t = 0..L-1:

    step 0, position t: token x_{t+1}, hidden fc(g_t),            rope position t,   predicts p_{t+1}
    step j, position t: token x_{t+1+j}, hidden = own step j-1 output at t, position t+j, predicts p_{t+1+j}

Ground-truth tokens are the inputs at every step (EAGLE-3): on data the target wrote greedily they
are exactly what the draft proposes whenever its earlier steps were right, which is the only case
that matters for acceptance. Attention at step j for position t sees the true prefix (step-0 keys
at positions 0..t) plus its own draft chain (keys of steps 1..j at position t), never another
position's chain (train/attention.py). The loss and the metric sums of the unrolled logits are
train/loss.py's; the metrics read from them, eaglekit/metrics.py's.

One unroll path: step 0 on the whole [B, L] grid (its keys are every later step's prefix), steps
1.. and the head at the positions some step counts (`ttt_positions`), or at every position.
tests/unit/test_train_ttt.py holds the whole-grid unroll it is tested against.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eaglekit.features.batch import counted_positions
from eaglekit.train.attention import ttt_attention
from eaglekit.train.loss import every_position, score_step, step_index


def ttt_unroll(
    draft,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    ttt_steps: int,
    attention: str = "dense",
    positions: tuple[torch.Tensor, torch.Tensor] | None = None,
    steps: StepFunctions | None = None,
) -> list[torch.Tensor]:
    """Run the draft for `ttt_steps` steps; returns the logits of each step.

    Args:
        draft: an `Eagle3Draft`.
        aux: [B, T, k*Ht] raw target aux states.
        input_ids: [B, T] raw token ids.
        ttt_steps: unroll length.
        attention: "merged" (flash prefix + own chain, no [L, L] scores; the default) or "dense" (the reference).
        positions: (rows, positions) [N] from `ttt_positions`. Step 0 runs on the whole grid (its keys
            are every later step's prefix); steps 1.. and the head run at these positions only.
            None: at every position.
        steps: the step functions (`EAGER_STEPS`, or `compiled_steps()`).

    Returns:
        ttt_steps tensors [N, Vd] at `positions`, or [B, L, Vd] (L = T-1) when positions is None:
        step j, position t predicts p_{t+1+j}; positions t >= L-j read padding and are never counted.
    """
    steps = steps or EAGER_STEPS
    B, L = input_ids.shape[0], input_ids.shape[1] - 1
    grid = positions is None
    rows, pos = every_position(B, L, input_ids.device) if grid else positions
    first_logits, hidden, k0, v0 = steps.first(draft, aux, input_ids, rows, pos, attention)
    logits = [first_logits]  # [N, Vd] a step
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
    return [x.view(B, L, -1) for x in logits] if grid else logits  # every_position is in reshape order


def first_step(draft, aux, input_ids, rows, pos, attention: str):
    """Step 0 on the whole grid, its hidden state and head at `positions` only.

    Returns: logits [N, Vd], hidden [N, H] (the carried state, `Eagle3Draft.finish`), k0 / v0 [B, nkv, L, hd] (the true prefix).
    """
    hidden = draft.fuse(aux[:, :-1])  # [B, L, H]: g_t
    tokens = input_ids[:, 1:]  # [B, L]: x_{t+1}
    B, L = tokens.shape
    grid = torch.arange(L, device=tokens.device).expand(B, L)
    q, k0, v0, residual = draft.attention_pieces(tokens, hidden, grid)
    hidden = draft.finish(ttt_attention(q, k0, v0, [], [], attention), residual)[rows, pos]  # [N, H]
    return draft.logits(hidden), hidden, k0, v0


def project_step(draft, hidden, input_ids, rows, pos, j):
    """Step j's rotated q/k/v at `positions` (token x_{t+1+j}, 0 past the end; rope position t+j), on the
    [B, L] grid (`to_grid`), and its residual [1, N, H]. j: 0-d long tensor."""
    tokens = input_ids[:, 1:]  # [B, L]
    B, L = tokens.shape
    at = pos + j  # [N]
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


def to_grid(x: torch.Tensor, positions: tuple[torch.Tensor, torch.Tensor], B: int, L: int) -> torch.Tensor:
    """[1, heads, N, hd] at `positions` -> [B, heads, L, hd], zeros elsewhere."""
    rows, pos = positions
    out = x.new_zeros(B, x.shape[1], L, x.shape[-1])
    out[rows, :, pos] = x[0].transpose(0, 1)  # [N, heads, hd]
    return out


def ttt_positions(loss_mask: torch.Tensor, ttt_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, positions) [N]: the draft positions t that some step j < ttt_steps counts (counted[t+1+j]).

    The head and the loss need only these: the prompt, the padding and what follows the last answer
    are a third or more of a packed batch, and the [N, Vd] logits are contiguous (a slice along the
    positions of [B, L, Vd] is not, and its elementwise kernels run strided). One host sync.
    """
    counted = counted_positions(loss_mask)  # [B, T]
    L = counted.shape[1] - 1
    ahead = F.pad(counted, (0, ttt_steps), value=False)  # [B, T + ttt_steps]
    wanted = torch.zeros_like(counted[:, :L])
    for j in range(ttt_steps):
        wanted |= ahead[:, 1 + j : 1 + j + L]
    found = wanted.nonzero()  # [N, 2]
    # Two tensors of their own, not views of one: a compiled step would guard on the shared base's sizes.
    return found[:, 0].contiguous(), found[:, 1].contiguous()


@dataclass(frozen=True)
class StepFunctions:
    """What one TTT step runs, as four functions: `ttt_unroll` calls `first` once and `project` and
    `finish` for each later step, `ttt_loss` calls `score` for every step. Eager (`EAGER_STEPS`), or
    each under torch.compile (`compiled_steps`): every TTT step then shares four graphs, so a compile
    traces and lowers one step's work, not the unroll's (docs/notes/training.md has the compile times).
    The merged attention of steps 1.. runs eagerly between them. Dynamo specializes a size of 1, so a one-row batch would compile all four again: the
    compiled loss gives such a batch an empty second row (`train.loop.with_empty_row`)."""

    first: Callable
    project: Callable
    finish: Callable
    score: Callable


EAGER_STEPS = StepFunctions(first_step, project_step, finish_step, score_step)
# Inductor's coalescing analysis for tiling (tiling_utils) raised an AssertionError in codegen on the
# unroll (`get_pw_red_splits`; docs/notes/training.md); without it inductor tiles as before.
COMPILE_OPTIONS = {"triton.coalesce_tiling_analysis": False}


@contextlib.contextmanager
def compile_guards():
    """Where compiled training code runs: dynamo's recompile limit raises instead of running eagerly
    unannounced, and no duck sizing (two sizes equal in one batch, rows and N say, must not become one
    symbol, or the next batch compiles again)."""
    with (
        torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
        torch.fx.experimental._config.patch(use_duck_shape=False),
    ):
        yield


@functools.cache
def compiled_steps(backend: str = "inductor") -> StepFunctions:
    """`EAGER_STEPS` under torch.compile, dynamic in the batch's sizes, the plain soft CE (inductor fuses
    it itself; `score`'s objective is the caller's). A shape that would recompile past dynamo's limit
    raises instead of running eagerly."""

    def compiled(fn, **fixed):
        graph = torch.compile(
            fn, dynamic=True, backend=backend, options=COMPILE_OPTIONS if backend == "inductor" else None
        )

        @functools.wraps(fn)
        def run(*args, **kw):
            with compile_guards():
                return graph(*args, **{**kw, **fixed})

        return run

    return StepFunctions(
        compiled(first_step), compiled(project_step), compiled(finish_step), compiled(score_step, soft_ce="plain")
    )
