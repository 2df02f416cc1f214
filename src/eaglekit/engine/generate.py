"""The engine: plain and speculative decoding of one sequence, on one target runner.

A speculation cycle is one fixed-shape `cycle` step (`_cycle_step`), read top to bottom:

    propose  the draft's chain or tree from the root, the last committed token (made by the
             previous cycle's advance, or after the prefill by the `proposal` step)
    verify   one target forward over the proposed tree (chain = a path) at positions n + depth,
             written at cache slots n .. n+N-1
    accept   which drafts the target accepts and the token it adds (`accept.accept`: greedy, or
             lossless sampling with one uniform draw per node, for a chain or a tree), on the device
    commit   the emitted tokens and the accepted count written into device buffers, the accepted
             path's KV moved to slots n .. n+a (compaction)
    advance  the draft caught up over the a+1 committed positions, n moved past them, and the next
             tree proposed from the new root (the token the target added)

The host replays `cycle_chunk` cycles back to back and then reads those buffers once (one small
device-to-host copy) to check stop tokens and length. Tokens past a stop token are dropped; the
extra cycles only cost time.

Plain fallback (`SpecConfig.plain_fallback`): a cycle costs c plain steps and commits tau tokens,
so it pays only while tau > c. The host times its chunks (cycles and plain steps, medians of the
latest chunks, kept by the engine across generations) and, when the recent cycles' tau is surely
below c, decodes plainly in windows of `fallback_window` tokens (the `decode` step, which then also
keeps each position's aux row), catching the draft up after each (one `fallback_window`-row draft
forward); after 1, 2, 4 .. 16 windows it proposes again and probes with one cycle. The graphs stay
as they are: falling back replays the plain step the baseline replays (docs/notes/engine.md,
"Drafting that stops").

Plain decoding (the baseline) is the `decode` step: one token per target forward, run `chunk`
times between host checks for a stop token. On CUDA every step is captured in a CUDA graph
(graphs.py), and the decode step and the cycle are compiled first (the prefill pieces and the first
proposal, run once a generation, are not); on CPU the same code runs eagerly. The prompt is prefilled the same way in both
modes: on CUDA in `prefill_chunk`-token pieces, each a replay of one captured (uncompiled) graph,
since an eager forward of a small model is tens of milliseconds of launches; elsewhere at once.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from eaglekit.engine.accept import accept
from eaglekit.engine.spec import SpecConfig
from eaglekit.engine.tree import Tree
from eaglekit.errors import EaglekitError
from eaglekit.metrics import accept_length
from eaglekit.runtime.graphs import COMPILE_MODE, Step, compiled
from eaglekit.runtime.kv import cache_mask, causal_block
from eaglekit.runtime.sampling import Sampling, next_token

PREFILL_CHUNK = 128  # prompt tokens per captured prefill step (CUDA graphs)
# The fallback's policy, tuned on a simulation (docs/notes/engine.md, "Drafting that stops").
FALLBACK_WINDOW = 64  # plain tokens per fallback window (one draft catch-up each)
FALLBACK_DOUBLINGS = 4  # a fallback lasts 1, 2, 4, 8, then at most 16 windows while probes fail
PROBE_CYCLES = 4  # cycles of a generation before the first decision
REPROBE_CYCLES = 1  # cycles after a fallback before the next decision
TAU_WINDOW = 32  # a decision reads the cycles since the last (re)start, at most this many
TAU_SLACK = 1.0  # fall back when tau + TAU_SLACK * sd / sqrt(cycles) is below the cost
ACCEPT_SD_FLOOR = 0.5  # the sd of a cycle's accepted count, at least (a few cycles say little)
EXPLORE_COST = 2.0  # a cycle's cost in plain steps assumed before any plain step was timed
TIMED_CHUNKS = 16  # chunks whose median time sets the cost


@dataclass
class Generation:
    """One generated answer.

    tokens: new tokens, the stop token included when one ended the answer.
    finish_reason: "stop" (a stop token) or "length" (max_new_tokens).
    accept_lengths: accepted drafts per cycle (tau = mean + 1); empty for plain decoding.
    seconds: wall time, prefill included.
    plain_tokens: tokens of a speculative generation decoded by plain steps (plain fallback).
    fallbacks: times a speculative generation fell back to plain steps.
    cycle_cost: a cycle's cost in plain steps that the fallback decided with (None without it).
    """

    tokens: list[int]
    finish_reason: str
    seconds: float
    accept_lengths: list[int] = field(default_factory=list)
    plain_tokens: int = 0
    fallbacks: int = 0
    cycle_cost: float | None = None

    @property
    def tau(self) -> float:
        """Tokens committed per target forward in the cycles (bonus included); 1.0 when plain."""
        return accept_length(self.accept_lengths)


def extend(out: list[int], new: list[int], max_new_tokens: int, stop_ids: set[int]) -> str | None:
    """Append new tokens up to a stop token or the length limit; return the finish reason if done."""
    for token in new:
        out.append(token)
        if token in stop_ids:
            return "stop"
        if len(out) >= max_new_tokens:
            return "length"
    return None


class CostMeter:
    """Host-timed seconds per plain step and per cycle: medians over the latest `TIMED_CHUNKS` chunks
    (each timed from its first replay to the read of its tokens, so host work counts)."""

    def __init__(self):
        self.samples = {"step": deque(maxlen=TIMED_CHUNKS), "cycle": deque(maxlen=TIMED_CHUNKS)}

    def add(self, kind: str, seconds: float, count: int) -> None:
        self.samples[kind].append(seconds / count)

    def cost(self) -> float | None:
        """A cycle's time in plain steps; None until both were timed."""
        step, cycle = self.samples["step"], self.samples["cycle"]
        if not step or not cycle:
            return None
        return statistics.median(cycle) / statistics.median(step)


class Engine:
    """Plain and speculative decoding at batch 1 on a target runner (runner.py).

    Args:
        target: a FAST or GENERIC target runner.
        drafter: a DraftRunner or OracleDrafter, or None for plain decoding only.
        spec: the speculation shape (required with a drafter).
        sampling: greedy (temperature 0) or sampling settings, shared by both modes.
        stop_token_ids: generation stops after any of these (EOS, end of turn).
        graphs: capture CUDA graphs (default: on CUDA).
        compile: torch.compile the steps (default: on CUDA).
        decode_chunk: plain decoding steps between host checks for a stop token.
        cycle_chunk: speculation cycles between host checks.
        prefill_chunk: prompt tokens per prefill step, 0 = the whole prompt in one eager forward
            (default: PREFILL_CHUNK with graphs, else 0).
        cycle_cost: with `spec.plain_fallback`, a cycle's cost in plain steps (None: timed).
        fallback_window: plain tokens per fallback window.
        probe_cycles: cycles of a generation before the fallback's first decision.
    """

    def __init__(
        self,
        target,
        *,
        drafter=None,
        spec: SpecConfig | None = None,
        sampling: Sampling = Sampling(),
        stop_token_ids=(),
        graphs: bool | None = None,
        compile: bool | None = None,
        compile_mode: str = COMPILE_MODE,
        decode_chunk: int = 8,
        cycle_chunk: int = 4,
        prefill_chunk: int | None = None,
        cycle_cost: float | None = None,
        fallback_window: int = FALLBACK_WINDOW,
        probe_cycles: int = PROBE_CYCLES,
    ):
        self.target, self.drafter, self.spec, self.sampling = target, drafter, spec, sampling
        self.stop_ids = set(int(t) for t in stop_token_ids)
        self.device = next(target.parameters()).device
        cuda = self.device.type == "cuda"
        self.graphs = cuda if graphs is None else graphs
        self.compile = cuda if compile is None else compile
        if self.graphs and not cuda:
            raise EaglekitError("CUDA graphs need a CUDA device", hint="drop --graphs on CPU")
        if drafter is not None and spec is None:
            raise EaglekitError("a drafter needs a speculation shape", hint="pass spec=SpecConfig(...)")
        if drafter is not None and drafter.needs_aux:
            wanted = list(drafter.draft.config.aux_layer_ids)
            if list(target.aux_layer_ids) != wanted:
                raise EaglekitError(
                    f"the draft reads aux layers {wanted}, the target runner captures {list(target.aux_layer_ids)}",
                    hint="build the runner with aux_layer_ids=draft.config.aux_layer_ids",
                )
        self.L, self.chunk, self.cycle_chunk = target.max_len, decode_chunk, cycle_chunk
        long = dict(dtype=torch.long, device=self.device)
        self.tok = torch.zeros(1, 1, **long)  # plain: the last token, fed to the next step
        self.pos = torch.zeros(1, **long)  # plain: its position
        depth = spec.max_depth if spec is not None else 0
        self.out = torch.zeros(self.L + depth + 2, **long)  # out[p] = the token chosen after position p
        self.one = torch.ones(1, 1, dtype=torch.bool, device=self.device)
        if fallback_window < 1:
            raise EaglekitError(
                f"fallback_window {fallback_window}: a window holds at least one token",
                hint="pass fallback_window >= 1",
            )
        self.fallback = spec is not None and drafter is not None and spec.plain_fallback
        self.window, self.cycle_cost, self.meter = fallback_window, cycle_cost, CostMeter()
        self.probe_cycles = max(probe_cycles, 1)
        # The draft catches up over a fallback window from the aux rows the decode step keeps.
        self.keep_aux = self.fallback and drafter.needs_aux
        if self.keep_aux:
            self.plain_aux = torch.zeros(
                self.window, target.aux_width, device=self.device, dtype=next(target.parameters()).dtype
            )  # [W, A] ring, by position % W
            self.window_last = torch.full((1,), self.window - 1, dtype=torch.long, device=self.device)
        self.decode = Step(
            compiled(self._decode_step, self.compile, compile_mode), use_graph=self.graphs, name="decode"
        )
        self.prefill_chunk = (PREFILL_CHUNK if self.graphs else 0) if prefill_chunk is None else prefill_chunk
        if self.prefill_chunk:
            self._init_prefill()
        if drafter is not None:
            self._init_speculation(compile_mode)

    def _init_prefill(self) -> None:
        C, dtype = self.prefill_chunk, next(self.target.parameters()).dtype
        long = dict(dtype=torch.long, device=self.device)
        self.chunk_ids = torch.zeros(C, **long)  # one piece of the prompt, zero-padded
        self.chunk_start = torch.zeros(1, **long)  # its first position
        self.chunk_last = torch.zeros(1, **long)  # index of its last real token
        self.prefill_logits = torch.zeros(self.target.vocab_size, dtype=dtype, device=self.device)
        self.prefill_aux = torch.zeros(self.L + C, max(self.target.aux_width, 1), dtype=dtype, device=self.device)
        # Not compiled: a compile per engine costs more than fusing a 128-row forward gains.
        self.prefill = Step(self._prefill_chunk_step, use_graph=self.graphs, name="prefill")

    # ---- static buffers and steps of speculation ------------------------------------------

    def _init_speculation(self, compile_mode: str) -> None:
        N, D = self.spec.num_nodes, self.spec.max_depth
        long = dict(dtype=torch.long, device=self.device)
        self.n = torch.zeros(1, **long)  # committed length = position of the root
        self.tree = Tree(
            tokens=torch.zeros(N, **long),
            parents=torch.zeros(N, **long),
            depth=torch.zeros(N, **long),
            anc=torch.zeros(N, N, dtype=torch.bool, device=self.device),
        )
        # A drafter whose shape never changes (a chain, the oracle) has it written once, here and
        # after each capture's reset; the cycle then copies only the tokens.
        self.fixed_shape = getattr(self.drafter, "fixed_shape", None)
        self.proposed = ("tokens",) if self.fixed_shape is not None else ("tokens", "parents", "depth", "anc")
        self._reset_tree()
        self.acc = torch.zeros(D + 3, **long)  # [count, bonus, path (D + 1)]
        self.cycle_index = torch.zeros(1, **long)  # cycles run since the prefill
        self.counts = torch.zeros(self.L + 1, **long)  # counts[c] = drafts accepted in cycle c
        self.aux_rows = torch.zeros(
            N, max(self.target.aux_width, 1), device=self.device, dtype=next(self.target.parameters()).dtype
        )
        # A sampled chain verifies with the full draft distribution q; deterministic drafts (trees,
        # the oracle) verify with q one-hot.
        self.sampled_chain = (
            self.spec.mode == "chain" and not self.sampling.greedy and getattr(self.drafter, "samples_chain", False)
        )
        if self.sampled_chain:
            vd = self.drafter.vocab_map.shape[0]
            self.q = torch.zeros(self.spec.k, vd, device=self.device)
        self.root = torch.zeros(1, **long)  # the first root, after the prefill
        # Not compiled: it runs once a generation (after the prefill; the cycle proposes inside its own
        # graph), and compiling it cost the bench stage seconds (docs/results/2026-12-04-h200-all-data).
        self.proposal = Step(self._propose_root_step, use_graph=self.graphs, name="proposal")
        self.cycle = Step(compiled(self._cycle_step, self.compile, compile_mode), use_graph=self.graphs, name="cycle")
        if self.keep_aux:  # uncompiled, as the proposal: it runs once a window
            self.window_catch_up = Step(self._window_catch_up_step, use_graph=self.graphs, name="window catch-up")

    def speculation_steps(self) -> list[Step]:
        """The captured steps speculation replays: the first proposal, the cycle, and with the
        plain fallback the decode step and the draft's catch-up over a window."""
        steps = [self.proposal, self.cycle]
        if self.fallback:
            steps.append(self.decode)
        if self.keep_aux:
            steps.append(self.window_catch_up)
        return steps

    def warmup(self, speculative: bool = True) -> None:
        """Compile and capture the steps a mode needs (once; `generate` calls it). No-op without graphs.

        Capturing runs each step a few times on the current buffers, so they are first reset to a
        harmless state (slot 0, empty tree); every generation then starts from its own prefill.
        """
        if not self.graphs:
            return
        steps = self.speculation_steps() if speculative and self.drafter is not None else [self.decode]
        steps = ([self.prefill] if self.prefill_chunk else []) + steps
        for step in steps:
            if step.graph is None:
                self.pos.zero_()
                self.tok.zero_()
                if self.prefill_chunk:
                    for t in (self.chunk_ids, self.chunk_start, self.chunk_last):
                        t.zero_()
                if self.drafter is not None:
                    for t in (self.n, self.acc, self.root, self.cycle_index):
                        t.zero_()
                    self._reset_tree()
                step.capture()

    def _reset_tree(self) -> None:
        """An empty tree, or the drafter's fixed shape; the mask has no empty row either way."""
        self.tree.tokens.zero_()
        if self.fixed_shape is not None:
            for name in ("parents", "depth", "anc"):
                getattr(self.tree, name).copy_(getattr(self.fixed_shape, name))
        else:
            self.tree.parents.zero_()
            self.tree.depth.zero_()
            self.tree.anc.copy_(torch.eye(self.tree.size, dtype=torch.bool))

    # ---- plain decoding -------------------------------------------------------------------

    def _prefill(self, ids: list[int]):
        """Target forward over the prompt at slots 0..P-1 -> ids [P], last logits [V], aux [P, A]:
        at once (eager), or in `prefill_chunk` pieces, each a replay of the prefill step."""
        P, C = len(ids), self.prefill_chunk
        x = torch.tensor(ids, dtype=torch.long, device=self.device)
        if not C:
            pos = torch.arange(P, device=self.device)
            logits, aux = self.target(
                x[None], pos[None], pos, cache_mask(causal_block(P, self.device), 0, 0, self.L), last_only=True
            )
            return x, logits[0, -1], (aux[0] if aux is not None else None)
        for start in range(0, P, C):
            piece = x[start : start + C]
            self.chunk_ids.copy_(torch.nn.functional.pad(piece, (0, C - piece.shape[0])))
            self.chunk_start.fill_(start)
            self.chunk_last.fill_(piece.shape[0] - 1)
            self.prefill()
        return x, self.prefill_logits, (self.prefill_aux[:P] if self.target.aux_width else None)

    def _prefill_chunk_step(self) -> None:
        """One piece of the prompt: positions start .. start+C-1 (padding rows past the cache clamp to
        its last slot; their outputs are never read), logits of the last real row, every row's aux."""
        C = self.prefill_chunk
        rows = self.chunk_start + torch.arange(C, device=self.device)
        pos = rows.clamp(max=self.L - 1)
        mask = cache_mask(causal_block(C, self.device), self.chunk_start, self.chunk_start, self.L)
        logits, aux = self.target(self.chunk_ids[None], pos[None], pos, mask)
        self.prefill_logits.copy_(logits[0].index_select(0, self.chunk_last)[0])
        if aux is not None:
            self.prefill_aux.index_copy_(0, rows, aux[0])

    def _prefill_plain(self, ids: list[int]) -> torch.Tensor:
        _, logits, _ = self._prefill(ids)
        first = next_token(logits, self.sampling)
        self.tok.copy_(first.view(1, 1))
        self.pos.fill_(len(ids))
        return first

    def _decode_step(self) -> None:
        n = self.pos
        mask = cache_mask(self.one, n, n, self.L)  # prefix + itself
        logits, aux = self.target(self.tok, n.view(1, 1), n, mask)
        if self.keep_aux:
            self.plain_aux.index_copy_(0, torch.remainder(n, self.window), aux[0])
        chosen = next_token(logits[0, -1], self.sampling).view(1)
        self.out.index_copy_(0, n, chosen)
        self.tok.copy_(chosen.view(1, 1))
        self.pos.add_(1)

    def _plain(self, ids: list[int], max_new_tokens: int) -> Generation:
        out: list[int] = []
        reason = extend(out, [int(self._prefill_plain(ids))], max_new_tokens, self.stop_ids)
        while reason is None:
            reason = self._decode_chunk(out, len(ids) + len(out) - 1, self.chunk, max_new_tokens)
        return Generation(tokens=out, finish_reason=reason, seconds=0.0)

    def _decode_chunk(self, out: list[int], start: int, steps: int, max_new_tokens: int) -> str | None:
        """Up to `steps` decode steps from position `start` (the last token's), one read; timed."""
        steps = min(steps, max_new_tokens - len(out))
        began = time.perf_counter()
        for _ in range(steps):
            self.decode()
        tokens = self.out[start : start + steps].tolist()
        if steps == self.chunk:  # as a cycle chunk: whole chunks only
            self.meter.add("step", time.perf_counter() - began, steps)
        return extend(out, tokens, max_new_tokens, self.stop_ids)

    # ---- speculative decoding: the host loop, then one cycle top to bottom ------------------

    def _speculate(self, ids: list[int], max_new_tokens: int, fallback: bool) -> Generation:
        """Replay `cycle_chunk` cycles, then read their counts and tokens in one copy. A chunk never
        runs past max_new_tokens by more than one cycle: it takes at most remaining // (D + 1) cycles.
        With `fallback`, after each chunk: plain steps for a while when the cycles do not pay."""
        D = self.spec.max_depth
        out: list[int] = []
        accepts: list[int] = []
        gen = Generation(tokens=out, finish_reason="", seconds=0.0, accept_lengths=accepts)
        reason = extend(out, [int(self._prefill_speculation(ids))], max_new_tokens, self.stop_ids)
        n = len(ids)  # the root's position
        since, doublings = 0, 0  # cycles since speculation (re)started; failed probes in a row
        probe = self.probe_cycles  # cycles before the next decision
        while reason is None:
            if fallback and since >= probe:
                if not self._pays(accepts[-min(since, TAU_WINDOW) :]):
                    before = len(out)
                    reason, n = self._fall_back(out, n, self.window << doublings, max_new_tokens)
                    gen.plain_tokens += len(out) - before
                    gen.fallbacks += 1
                    since, doublings, probe = 0, min(doublings + 1, FALLBACK_DOUBLINGS), REPROBE_CYCLES
                    continue
                doublings = 0
            cycles = max(1, min(self.cycle_chunk, (max_new_tokens - len(out)) // (D + 1)))
            if fallback and since < probe:
                cycles = min(cycles, probe - since)  # a probe decides early
            began = time.perf_counter()
            for _ in range(cycles):
                self.cycle()
            first = len(accepts)
            read = torch.cat([self.counts[first : first + cycles], self.out[n : n + cycles * (D + 1)]]).tolist()
            if cycles == self.cycle_chunk:  # a probe's short chunk pays one sync for fewer cycles
                self.meter.add("cycle", time.perf_counter() - began, cycles)
            counts, tokens = read[:cycles], read[cycles:]
            since += cycles
            for count in counts:
                accepts.append(count)
                reason = extend(out, tokens[: count + 1], max_new_tokens, self.stop_ids)
                tokens, n = tokens[count + 1 :], n + count + 1
                if reason is not None:
                    break
        gen.finish_reason = reason
        if fallback:
            gen.cycle_cost = self._cost()
        return gen

    def _prefill_speculation(self, ids: list[int]) -> torch.Tensor:
        x, logits, aux = self._prefill(ids)
        root = next_token(logits, self.sampling).view(1)
        if self.drafter.needs_aux:
            self.drafter.catch_up(torch.cat([x[1:], root]), aux, 0, len(ids) - 1)
        self.n.fill_(len(ids))
        self.cycle_index.zero_()
        self.root.copy_(root)
        self.proposal()
        return root

    def _cycle_step(self) -> None:
        """One cycle on the tree proposed last, without a host sync: verify it, accept a path, commit
        it, advance (the draft catches up and proposes the next tree)."""
        logits = self._verify()  # [N, V]
        count, path, bonus = accept(
            self.tree, logits, self.sampling, self.spec.max_depth, q=self._chain_q(logits.shape[-1])
        )
        self.acc.copy_(torch.cat([count, bonus, path]))  # what commit, advance, the profile read
        emitted = self._commit()
        self._advance(emitted)

    def _propose_root_step(self) -> None:
        self._propose(self.root)

    def _propose(self, root: torch.Tensor) -> None:
        proposal = self.drafter.propose(root, self.n)
        for name in self.proposed:
            getattr(self.tree, name).copy_(getattr(proposal.tree, name))
        if self.sampled_chain:
            self.q.copy_(proposal.q)

    def _verify(self) -> torch.Tensor:
        """One target forward over the tree at positions n + depth, slots n .. n+N-1 -> logits [N, V];
        the nodes' aux rows kept for the draft's catch-up."""
        tree, n = self.tree, self.n
        slots = n + torch.arange(tree.size, device=self.device)
        logits, aux = self.target(tree.tokens[None], (n + tree.depth)[None], slots, cache_mask(tree.anc, n, n, self.L))
        if aux is not None:
            self.aux_rows.copy_(aux[0])
        return logits[0]

    def _chain_q(self, vocab_size: int) -> torch.Tensor | None:
        """[k, V] a sampled chain's draft distributions in target ids; None when drafts are verified
        as one-hot (greedy, trees, the oracle)."""
        if not self.sampled_chain:
            return None
        q = torch.zeros(self.spec.k, vocab_size, device=self.device)
        q.index_copy_(1, self.drafter.vocab_map, self.q)  # draft ids -> target ids
        return q

    def _commit(self) -> torch.Tensor:
        """Write the accepted path's tokens at out[n ..] and its count at counts[cycle]; move the
        path's KV to slots n .. n+a (a chain is in place). Returns the emitted tokens (`_emitted`)."""
        D = self.spec.max_depth
        rows = torch.arange(D + 1, device=self.device)
        emitted = self._emitted()
        self.out.index_copy_(0, self.n + rows, emitted)
        self.counts.index_copy_(0, self.cycle_index, self.acc[0:1])
        self.cycle_index.add_(1)
        if self.spec.mode == "tree":
            self.target.move_kv(self.n + self.acc[2:], self.n + rows)
        return emitted

    def _emitted(self) -> torch.Tensor:
        """[D + 1] the tokens after positions n .. n+D on the accepted path: row i < count is the
        accepted draft i+1, row count the bonus (later rows repeat it; the next cycle overwrites them)."""
        rows = torch.arange(self.spec.max_depth + 1, device=self.device)
        count, bonus, path = self.acc[0:1], self.acc[1:2], self.acc[2:]
        after = torch.cat([path[1:], path[-1:]])  # row i reads node i+1
        return torch.where(rows < count, self.tree.tokens[after], bonus)

    def _advance(self, emitted: torch.Tensor) -> None:
        """The draft's catch-up over the committed rows (`emitted`), n past them, the next proposal."""
        count, bonus, path = self.acc[0:1], self.acc[1:2], self.acc[2:]
        if self.drafter.needs_aux:
            self.drafter.catch_up(emitted, self.aux_rows[path], self.n, count)
        self.n.add_(count + 1)
        self._propose(bonus)

    # ---- plain fallback -------------------------------------------------------------------

    def _pays(self, accepts: list[int]) -> bool:
        """Whether these cycles commit at least what they cost, or might: tau's upper bound
        (one standard error above the mean) against a cycle's cost in plain steps."""
        k = len(accepts)
        mean = sum(accepts) / k
        sd = max((sum((a - mean) ** 2 for a in accepts) / k) ** 0.5, ACCEPT_SD_FLOOR)
        return 1 + mean + TAU_SLACK * sd / k**0.5 >= self._cost()

    def _cost(self) -> float:
        """A cycle's cost in plain steps: given, else timed (EXPLORE_COST until a plain step was timed)."""
        if self.cycle_cost is not None:
            return self.cycle_cost
        cost = self.meter.cost()
        return EXPLORE_COST if cost is None else cost

    def _fall_back(self, out: list[int], n: int, tokens: int, max_new_tokens: int) -> tuple[str | None, int]:
        """Decode `tokens` plainly from the root at position n (the draft's proposal from it is dropped),
        catching the draft up after each window, then propose from the new root. Returns the finish
        reason (None if the answer goes on) and the new root's position."""
        W = self.window
        self.pos.copy_(self.n)
        self.tok.copy_(self.tree.tokens[:1].view(1, 1))  # the root
        done = 0
        while done < tokens:
            before = len(out)
            reason = self._decode_chunk(out, n, min(self.chunk, W - done % W), max_new_tokens)
            n, done = n + len(out) - before, done + len(out) - before
            if reason is not None:
                return reason, n
            if done % W == 0:
                if self.keep_aux:
                    self.window_catch_up()
                self.n.add_(W)
        self.root.copy_(self.tok.view(1))
        self.proposal()
        return None, n

    def _window_catch_up_step(self) -> None:
        """Draft entries for the window's positions n .. n+W-1, decoded plainly: entry t reads
        out[t] (the token after t) and the aux row the decode step kept for t."""
        rows = self.n + torch.arange(self.window, device=self.device)  # [W]
        self.drafter.catch_up(
            self.out[rows], self.plain_aux[torch.remainder(rows, self.window)], self.n, self.window_last
        )

    # ---- entry point ----------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        *,
        speculative: bool = True,
        seed: int | None = None,
        plain_fallback: bool | None = None,
    ) -> Generation:
        """Generate up to `max_new_tokens` after `prompt_ids`.

        Args:
            prompt_ids: the prompt's token ids (already rendered with the chat template).
            max_new_tokens: length limit.
            speculative: draft and verify (needs a drafter); False decodes plainly.
            seed: seeds the device's sampling and acceptance draws (sampling only).
            plain_fallback: False speculates throughout (a cycle's profile); None follows the spec.
        """
        speculative = speculative and self.drafter is not None
        headroom = self.spec.headroom if speculative else 0
        if not prompt_ids or len(prompt_ids) + max_new_tokens + headroom > self.L:
            raise EaglekitError(
                f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) + draft headroom ({headroom}) "
                f"does not fit the {self.L} cache slots",
                hint="build the engine with a larger max_len",
            )
        self.warmup(speculative)
        if seed is not None:
            torch.manual_seed(seed)
        self._sync()
        start = time.perf_counter()
        if speculative:
            gen = self._speculate(prompt_ids, max_new_tokens, self.fallback and plain_fallback is not False)
        else:
            gen = self._plain(prompt_ids, max_new_tokens)
        self._sync()
        gen.seconds = time.perf_counter() - start
        return gen

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
