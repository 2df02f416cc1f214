"""Speculative decoding in its plainest form, the reference the engine is tested against.

gpt-fast's `speculative_decode`, for an EAGLE-3 draft: greedy, a chain of k drafts, one sequence,
eager, no CUDA graphs. The target runs over the whole sequence every cycle (no cache to roll back);
the draft keeps its own KV cache of the committed positions. Each cycle reads top to bottom:

    propose  the draft catches up over the newly committed positions (token i+1 with the target's
             aux states of position i), then drafts k tokens, each step fed its own token and
             carried output (pre-norm; normed with norm_output)
    verify   one target forward over the sequence and the drafts: the target's token after each
    accept   the longest prefix of drafts equal to the target's tokens (a drafts)
    commit   those a drafts and the target's own next token (tau counts it: a + 1 per cycle)
    advance  the target's aux states of the committed positions, for the next catch-up

`Engine` (generate.py: static caches, compaction, trees, CUDA graphs) gives the same tokens and
the same accepted counts on a greedy chain (tests/unit/test_engine_reference.py); the doctor's probe
runs this on a target it recorded (doctor/probe.py).
"""

from __future__ import annotations

from typing import Callable

import torch

from eaglekit.draft.model import Eagle3Draft

# target(ids [T]) -> (the target's greedy token after each position [T], aux states [T, A])
Target = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def speculative_decode(
    target: Target,
    draft: Eagle3Draft,
    prompt: list[int],
    max_new_tokens: int,
    k: int,
    *,
    stop_ids=(),
    fuse: Callable | None = None,
) -> tuple[list[int], list[int]]:
    """Up to `max_new_tokens` after `prompt` (a stop token ends it). A cycle drafts at most as many
    tokens as are still to come, so near the end only tokens the target still emits count.

    Args:
        fuse: aux states [T, A] -> the draft's input states [T, H] (default: the draft's own `fc`).

    Returns:
        the new tokens, and the accepted drafts of every cycle (tau = mean + 1).
    """
    fuse = fuse or draft.fuse
    V = draft.config.vocab_size
    tokens = torch.tensor(prompt)
    choice, aux = target(tokens)  # prefill
    tokens = torch.cat([tokens, choice[-1:]])
    kv, seen, accepted = None, 0, []  # the draft caches positions < seen
    while not _done(tokens[len(prompt) :].tolist(), max_new_tokens, stop_ids):
        n = len(tokens)  # the root tokens[n-1] is not cached
        # propose: catch up over positions seen .. n-2, then draft from the root
        logits, h, kv = draft(tokens[seen + 1 :][None], fuse(aux[seen : n - 1])[None], past_kv=kv)
        seen, h, step_kv, drafts = n - 1, h[:, -1:], kv, []
        window = min(k, max_new_tokens - (n - len(prompt)))  # drafts past the limit never count
        while len(drafts) < window:
            token = draft.draft_to_target(logits[0, -1].argmax())
            if not 0 <= token < V:  # no target token: never accepted
                break
            drafts.append(token)
            if len(drafts) < window:  # its own token and carried output
                logits, h, step_kv = draft(token.view(1, 1), h, past_kv=step_kv)
        drafts = torch.stack(drafts) if drafts else tokens[:0]
        # verify
        choice, aux = target(torch.cat([tokens, drafts]))
        choice = choice[n - 1 :]  # [len(drafts) + 1] after the root, each draft
        # accept
        a = int(torch.cumprod(drafts == choice[: len(drafts)], 0).sum())
        # commit
        tokens = torch.cat([tokens, drafts[:a], choice[a : a + 1]])
        accepted.append(a)
        # advance: aux keeps only the committed positions' states (rejected drafts' are dropped)
        aux = aux[: len(tokens) - 1]
    new = tokens[len(prompt) :].tolist()
    return new[: _done(new, max_new_tokens, stop_ids)], accepted


def _done(new: list[int], max_new_tokens: int, stop_ids) -> int:
    """How many new tokens the answer keeps once it ended (up to a stop token or the limit); 0 while not."""
    stop = next((i + 1 for i, t in enumerate(new) if t in stop_ids), None)
    if stop is not None:
        return min(stop, max_new_tokens)
    return max_new_tokens if len(new) >= max_new_tokens else 0
