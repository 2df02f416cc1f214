"""Batched plain generation: many prompts, static KV cache, one CUDA graph for the decode step.

    from eaglekit.engine.batch import generate_batch
    completions = generate_batch(target, prompts, max_new_tokens=512,
                                 sampling=Sampling(temperature=0.7, top_p=0.9), batch_size=32)
    completions[i].tokens, completions[i].finish_reason

Prompts are sorted by length and decoded `batch_size` at a time, left-padded to the longest in the
batch; every row writes the same cache slot each step, its own position is slot - padding. Rows
that finished keep computing (static shapes) and are ignored. The runner is the engine's target
runner (FAST when the config allows, else GENERIC), so output equals the engine's plain decoding.

Shapes: B batch rows, P padded prompt length, L cache slots, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglekit.engine.graphs import COMPILE_MODE, Step, compiled
from eaglekit.engine.runner import make_target_runner
from eaglekit.engine.sampling import Sampling, next_token
from eaglekit.errors import EaglekitError
from eaglekit.target.load import Target


@dataclass
class Completion:
    """tokens: new tokens, the stop token included if one ended it; finish_reason "stop" | "length"."""

    tokens: list[int]
    finish_reason: str


def padded_mask(pad: torch.Tensor, query_slots: torch.Tensor, max_len: int) -> torch.Tensor:
    """[B] left padding, [T] query slots -> [B, 1, T, L] bool: slots pad_b .. query (causal).

    A padding query sees only itself, so no row of the softmax is empty.
    """
    cols = torch.arange(max_len, device=pad.device).view(1, 1, max_len)
    q = query_slots.view(1, -1, 1)
    seen = (cols >= pad.view(-1, 1, 1)) & (cols <= q)
    return (seen | (cols == q)).unsqueeze(1)


class BatchDecoder:
    """Static buffers and the captured decode step for `batch_size` rows of `max_len` slots."""

    def __init__(self, runner, *, sampling: Sampling, graphs: bool, compile: bool, chunk: int = 16,
                 compile_mode: str = COMPILE_MODE):
        self.runner, self.sampling, self.chunk = runner, sampling, chunk
        B, L = runner.batch_size, runner.max_len
        self.device = next(runner.parameters()).device
        long = dict(dtype=torch.long, device=self.device)
        self.tok = torch.zeros(B, 1, **long)       # last chosen token of every row
        self.slot = torch.zeros(1, **long)         # the cache slot the next step writes
        self.pad = torch.zeros(B, **long)          # left padding of every row
        self.out = torch.zeros(B, L + 1, **long)   # out[b, s] = token chosen at slot s
        self.step = Step(compiled(self._step, compile, compile_mode), use_graph=graphs, name="batch decode")
        if graphs:
            self.prefill([[1, 2, 3]] * B)
            self.step.capture()

    def _step(self) -> None:
        mask = padded_mask(self.pad, self.slot, self.runner.max_len)
        logits, _ = self.runner(self.tok, (self.slot - self.pad).view(-1, 1), self.slot, mask)
        chosen = next_token(logits[:, -1], self.sampling)                    # [B]
        self.out.index_copy_(1, self.slot, chosen.view(-1, 1))
        self.tok.copy_(chosen.view(-1, 1))
        self.slot.add_(1)

    def prefill(self, prompts: list[list[int]]) -> list[int]:
        """Left-pad and run the prompts (eager); returns every row's first new token."""
        P = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long, device=self.device)
        pad = torch.tensor([P - len(p) for p in prompts], dtype=torch.long, device=self.device)
        slots = torch.arange(P, device=self.device)
        positions = (slots.view(1, P) - pad.view(-1, 1)).clamp(min=0)
        logits, _ = self.runner(ids, positions, slots, padded_mask(pad, slots, self.runner.max_len), last_only=True)
        first = next_token(logits[:, -1], self.sampling)
        self.pad.copy_(pad)
        self.tok.copy_(first.view(-1, 1))
        self.slot.fill_(P)
        return first.tolist()

    @torch.no_grad()
    def run(self, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int]) -> list[Completion]:
        """Decode one batch (exactly batch_size prompts) until every row stopped or hit the limit."""
        P = max(len(p) for p in prompts)
        outs: list[list[int]] = [[t] for t in self.prefill(prompts)]
        reasons: list[str | None] = [("stop" if o[0] in stop_ids else None) for o in outs]
        made = 1
        while made < max_new_tokens and any(r is None for r in reasons):
            steps = min(self.chunk, max_new_tokens - made)
            for _ in range(steps):
                self.step()
            start = P + made - 1
            new = self.out[:, start:start + steps].tolist()
            made += steps
            for row, tokens in enumerate(new):
                for token in tokens:
                    if reasons[row] is not None:
                        break
                    outs[row].append(token)
                    if token in stop_ids:
                        reasons[row] = "stop"
        return [Completion(tokens=o[:max_new_tokens], finish_reason=r or "length") for o, r in zip(outs, reasons)]


@torch.no_grad()
def generate_batch(target, prompts: list[list[int]], *, max_new_tokens: int, sampling: Sampling = Sampling(),
                   stop_token_ids=None, batch_size: int = 32, runner: str = "auto", graphs: bool | None = None,
                   compile: bool | None = None, seed: int | None = None, max_len: int | None = None,
                   progress: bool = False) -> list[Completion]:
    """Generate an answer for every prompt with plain batched decoding (the fast path for data).

    Args:
        target: a loaded `eaglekit.target.Target` (or an HF causal LM, then pass stop_token_ids).
        prompts: token ids of each prompt, chat template already applied (`target.chat.prompt_ids`).
        max_new_tokens: length limit per answer.
        sampling: greedy by default; temperature / top_p / top_k for sampling.
        stop_token_ids: ids that end an answer (default: the target's EOS / end-of-turn ids).
        batch_size: rows decoded together (the KV cache holds batch_size x max_len slots).
        runner: "auto", "fast" or "generic" (see `engine.runner`).
        graphs, compile: CUDA graphs / torch.compile (default: on when the model is on CUDA).
        seed: seeds sampling.
        max_len: cache slots per row (default: longest prompt + max_new_tokens, rounded up to 64).
        progress: show a tqdm bar over batches.

    Returns:
        One `Completion` per prompt, in the order given.
    """
    model = target.model if isinstance(target, Target) else target
    if stop_token_ids is None:
        if not isinstance(target, Target):
            raise EaglekitError("no stop token ids given", hint="pass stop_token_ids or a loaded Target")
        stop_token_ids = target.stop_token_ids
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise EaglekitError("an empty prompt was given", hint="every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    needed = longest + max_new_tokens
    max_len = max_len or -(-needed // 64) * 64
    if needed > max_len:
        raise EaglekitError(f"the longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_len {max_len}",
                            hint="raise max_len or shorten the prompts")
    cuda = next(model.parameters()).device.type == "cuda"
    graphs = cuda if graphs is None else graphs
    compile = cuda if compile is None else compile
    batch_size = min(batch_size, len(prompts))
    if seed is not None:
        torch.manual_seed(seed)
    built = make_target_runner(model, max_len=max_len, batch_size=batch_size, runner=runner)
    decoder = BatchDecoder(built, sampling=sampling, graphs=graphs, compile=compile)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    results: list[Completion | None] = [None] * len(prompts)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc="generate", unit="batch")
    for rows in batches:
        filled = rows + [rows[0]] * (batch_size - len(rows))    # static shape: repeat a prompt
        done = decoder.run([prompts[i] for i in filled], max_new_tokens, set(int(t) for t in stop_token_ids))
        for i, completion in zip(rows, done):
            results[i] = completion
    return results
