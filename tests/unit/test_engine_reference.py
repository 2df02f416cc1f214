"""The engine against the eager reference speculative decode (engine/reference.py): on a seeded tiny
target, greedy chain speculation in the graphed and compiled engine gives the reference's tokens and
accepts the same drafts, cycle for cycle."""

import pytest
import torch

from eaglekit.engine import DraftRunner, Engine, SpecConfig
from eaglekit.engine.reference import speculative_decode
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.targets.capture import capture_aux_states
from engine_tiny import AUX, PROMPTS, fake_cuda_graphs, one_thread, peaked_model, random_draft  # noqa: F401 (fixture)
from oracle_draft import repeat_draft

NEW, L = 40, 128


def eager_target(model, aux_layer_ids):
    """The HF model over the whole sequence: its greedy token after each position, and its aux states."""

    def target(ids: torch.Tensor):
        cap = capture_aux_states(model, ids[None], list(aux_layer_ids))
        return cap.logits[0].argmax(-1), cap.aux_hidden[0]

    return target


def repeat_target():
    """A tiny Llama target with a draft that it accepts often (the repeat oracle: tests/helpers/oracle_draft.py)."""
    model = peaked_model("llama", std=0.1)
    return model, repeat_draft(model, draft_vocab=model.config.vocab_size).eval()


@pytest.mark.parametrize("mode", ["eager", "graphs", "compiled"])
def test_engine_accepts_what_the_reference_accepts(mode, monkeypatch):
    model, draft = repeat_target()
    aux = list(draft.config.aux_layer_ids)
    spec = SpecConfig(mode="chain", k=3)
    if mode == "graphs":
        fake_cuda_graphs(monkeypatch)
    engine = Engine(
        make_target_runner(model, max_len=L, aux_layer_ids=aux),
        drafter=DraftRunner(draft, spec=spec, sampling=Sampling(), max_len=L),
        spec=spec,
        compile=mode == "compiled",
        prefill_chunk=8 if mode == "graphs" else None,
    )
    if mode == "graphs":
        engine.graphs = True
        for step in (engine.prefill, engine.decode, engine.proposal, engine.cycle):
            step.use_graph = True
    accepted = 0
    for prompt in PROMPTS:
        tokens, counts = speculative_decode(eager_target(model, aux), draft, prompt, NEW, k=3)
        gen = engine.generate(prompt, NEW)
        assert gen.tokens == tokens
        # the engine counts the last cycle's drafts in full, the reference only those within the limit
        assert gen.accept_lengths[:-1] == counts[:-1] and counts[-1] <= gen.accept_lengths[-1]
        accepted += sum(counts)
    assert accepted > NEW // 2  # the draft is accepted often: a real comparison


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_reference_decodes_the_target_greedily(arch):
    """Whatever the draft proposes, the reference's tokens are the target's plain greedy decoding,
    and a stop token ends them."""
    model = peaked_model(arch)
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    draft = random_draft(model, draft_vocab=target.vocab_size // 2)
    for prompt in PROMPTS:
        plain = Engine(target).generate(prompt, NEW, speculative=False).tokens
        tokens, counts = speculative_decode(eager_target(model, AUX), draft, prompt, NEW, k=4)
        assert tokens == plain and len(tokens) == NEW and 1 + sum(c + 1 for c in counts) >= NEW
        stop = plain[NEW // 2]
        cut, _ = speculative_decode(eager_target(model, AUX), draft, prompt, NEW, k=4, stop_ids={stop})
        assert cut == plain[: plain.index(stop) + 1]
