"""The live probe: how many draft tokens the target accepts, with the draft as an engine reads it.

Greedy speculative decoding emits exactly the target's greedy continuation, so acceptance is fully
determined by that continuation and by what the draft proposes at each verify step. The probe
therefore generates the continuation once per prompt, captures every decoder layer's output over it
in one target forward, and replays chain drafting of k tokens at each verify step the way an
EAGLE-3 engine runs it (the reference speculative decode, engine/reference.py, with the recording as
its target): the draft's cache holds the committed prefix, computed from the target's aux states
(step 0), and steps 1..k-1 feed the draft its own token and carried output. Accept length
tau counts the bonus token, per-position acceptance is P(first i+1 drafts accepted) (vLLM's metric).

Because the target's states are kept for all layers, a misreading (other aux layers, one final
state instead of concatenated ones, other weights) is re-probed without running the target again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft
from eaglekit.engine.reference import speculative_decode
from eaglekit.errors import EaglekitError
from eaglekit.metrics import accept_length, acceptance_by_position
from eaglekit.targets.capture import capture_aux_states
from eaglekit.targets.chat import prompt_ids
from eaglekit.targets.load import text_config


@dataclass
class ProbeSetup:
    """A runnable version of the draft: the weights and inputs an engine would give it."""

    label: str
    config: DraftConfig  # aux_layer_ids = layers captured; norm_before_residual as read
    tensors: dict[str, torch.Tensor]  # native names; anything absent keeps a seeded random init
    single_state: bool = False  # feed the target's final (post-norm) state and skip fc
    embedding: torch.Tensor | None = None  # None: the target's input embedding


@dataclass
class TargetRun:
    """One prompt and the target's greedy continuation, with every layer's output kept."""

    tokens: torch.Tensor  # [T] prompt + continuation
    prompt_len: int
    layer_states: torch.Tensor  # [N, T, H] output of each decoder layer (pre final norm)
    final_state: torch.Tensor  # [T, H] after the final norm (what a target returns without aux capture)


@dataclass
class ProbeResult:
    label: str
    tau: float | None
    per_position: list[float] = field(default_factory=list)
    drafts: int = 0
    error: str | None = None

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "tau": self.tau,
            "per_position": self.per_position,
            "drafts": self.drafts,
            "error": self.error,
        }


@torch.no_grad()
def run_target(model, tokenizer, messages: list[dict], *, max_new_tokens: int, stop_ids: list[int]) -> TargetRun:
    """Greedy continuation of one chat prompt, then one forward capturing every layer's output."""
    ids = torch.tensor([prompt_ids(tokenizer, messages)], device=next(model.parameters()).device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop_ids or [0])[0]
    out = model.generate(
        ids,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=stop_ids or None,
        pad_token_id=pad,
        attention_mask=torch.ones_like(ids),
    )
    N, H = text_config(model.config).num_hidden_layers, text_config(model.config).hidden_size
    cap = capture_aux_states(model, out, list(range(N)), return_logits=False)
    T = out.shape[1]
    # Kept in the target's dtype: the draft is replayed in the dtype the target ran in (the serving dtype).
    states = cap.aux_hidden[0].view(T, N, H).transpose(0, 1).cpu()  # [N, T, H]
    return TargetRun(
        tokens=out[0].cpu(), prompt_len=ids.shape[1], layer_states=states, final_state=cap.last_hidden[0].cpu()
    )


def build_draft(setup: ProbeSetup, target_embedding: torch.Tensor) -> Eagle3Draft:
    """The draft as the setup describes it; what the engine would not load keeps a seeded random init.
    It runs in the target embedding's dtype (the dtype the target ran in: the serving dtype)."""
    torch.manual_seed(0)
    draft = Eagle3Draft(setup.config)
    own = draft.draft_state_dict()
    for name, tensor in setup.tensors.items():
        if name not in own:
            continue
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise EaglekitError(
                f"{name} is {tuple(tensor.shape)}, the engine builds {tuple(own[name].shape)}",
                hint="the engine would refuse to load this draft",
            )
    draft.load_state_dict({k: v for k, v in setup.tensors.items() if k in own}, strict=False)
    draft.set_target_embedding(setup.embedding if setup.embedding is not None else target_embedding)
    return draft.to(target_embedding.dtype).eval()


@torch.no_grad()
def replay(draft: Eagle3Draft, run: TargetRun, setup: ProbeSetup, k: int) -> list[int]:
    """Accepted draft count at every verify step of greedy chain decoding over one continuation: the
    reference speculative decode (engine/reference.py) with the recorded run as the target."""
    tokens, T = run.tokens, run.tokens.shape[0]
    if setup.single_state:
        states, fuse = run.final_state, (lambda h: h)  # [T, H], fc skipped
    else:
        ids = list(setup.config.aux_layer_ids)
        N = run.layer_states.shape[0]
        if not all(0 <= i < N for i in ids):
            raise EaglekitError(f"aux layers {ids} do not exist in a {N}-layer target")
        states, fuse = torch.cat([run.layer_states[i] for i in ids], dim=-1), draft.fuse  # [T, k*H]
    # Position i's token is tokens[i+1]; past the end (never committed: the answer is complete) the last.
    chosen = torch.cat([tokens[1:], tokens[-1:]])

    def recorded(ids: torch.Tensor):
        return chosen[: ids.shape[0]], states[: ids.shape[0]]

    _, accepted = speculative_decode(
        recorded, draft, tokens[: run.prompt_len].tolist(), T - run.prompt_len, k, fuse=fuse
    )
    return accepted


def probe(setup: ProbeSetup, runs: list[TargetRun], target_embedding: torch.Tensor, k: int) -> ProbeResult:
    """tau and per-position acceptance of one setup over the prompts' continuations."""
    try:
        draft = build_draft(setup, target_embedding)
        counts = [a for run in runs for a in replay(draft, run, setup, k)]
    except (EaglekitError, IndexError, RuntimeError) as err:
        return ProbeResult(setup.label, None, error=str(err).splitlines()[0])
    if not counts:
        return ProbeResult(setup.label, None, error=f"the continuations are shorter than k={k} tokens")
    return ProbeResult(
        setup.label,
        tau=round(accept_length(counts), 3),
        per_position=[round(x, 3) for x in acceptance_by_position(counts, k)],
        drafts=len(counts),
    )


def with_aux(setup: ProbeSetup, ids: list[int], label: str) -> ProbeSetup:
    return replace(setup, label=label, config=replace(setup.config, aux_layer_ids=tuple(ids)))
