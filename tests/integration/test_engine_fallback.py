"""Plain-step fallback: sampling through it keeps the target's distribution (700 draws), and the compiled steps keep plain greedy's tokens."""

from dataclasses import replace

import pytest
import torch

from eaglekit.engine import DraftRunner, Engine, SpecConfig
from eaglekit.runtime import Sampling, make_target_runner
from engine_tiny import (
    AUX,
    CHAIN,
    PROMPTS,
    TREE,
    chi_square_pvalue,
    one_thread,  # noqa: F401 (fixture)
    peaked_model,
    random_draft,
)

SPECS = pytest.mark.parametrize("spec", [replace(s, plain_fallback=True) for s in (CHAIN, TREE)], ids=["chain", "tree"])
NEW, L = 48, 128  # as in tests/unit/test_engine_fallback.py


@pytest.mark.slow
def test_fallback_sampling_is_reproducible_and_keeps_the_distribution():
    """Tiny vocabulary (6), chain k=1, one-cycle probes and a cost that always falls back: the first
    three tokens (the prefill's, the probe's one or two, then a plain step's when the draft was
    rejected) follow the HF model's p(x1) p(x2 | x1) p(x3 | x1 x2)."""
    V = 6
    model = peaked_model("llama", vocab_size=V, std=0.15)
    target = make_target_runner(model, max_len=48, aux_layer_ids=AUX)
    sampling = Sampling(temperature=1.0)
    spec = SpecConfig(mode="chain", k=1, plain_fallback=True)
    draft = DraftRunner(random_draft(model, seed=1), spec=spec, sampling=sampling, max_len=48)
    engine = Engine(
        target,
        drafter=draft,
        spec=spec,
        sampling=sampling,
        cycle_cost=9.0,
        fallback_window=2,
        probe_cycles=1,
        cycle_chunk=1,
    )
    prompt = [3, 1, 4]
    a, b = engine.generate(prompt, 12, seed=5), engine.generate(prompt, 12, seed=5)
    assert a.tokens == b.tokens and a.plain_tokens > 0
    counts = torch.zeros(V**3, dtype=torch.float64)
    third = 0  # answers whose third token was a plain step's
    for seed in range(700):
        gen = engine.generate(prompt, 3, seed=seed)
        x = gen.tokens
        counts[(x[0] * V + x[1]) * V + x[2]] += 1
        third += gen.plain_tokens > 0
    with torch.no_grad():
        p1 = model(input_ids=torch.tensor([prompt])).logits[0, -1].double().softmax(-1)
        p2 = model(input_ids=torch.tensor([prompt + [x] for x in range(V)])).logits[:, -1].double().softmax(-1)
        rows = torch.tensor([prompt + [x, y] for x in range(V) for y in range(V)])
        p3 = model(input_ids=rows).logits[:, -1].double().softmax(-1).view(V, V, V)
    exact = (p1[:, None, None] * p2[:, :, None] * p3).flatten()
    assert 100 < third < 600
    assert chi_square_pvalue(counts, exact) > 1e-3


@pytest.mark.slow
@SPECS
def test_compiled_fallback_equals_plain_decoding(spec):
    """The steps under torch.compile, falling back and probing: the tokens stay plain greedy's."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = Engine(target).generate(PROMPTS[0], NEW, speculative=False).tokens
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    gen = Engine(target, drafter=draft, spec=spec, compile=True, cycle_cost=2.0, fallback_window=4).generate(
        PROMPTS[0], NEW
    )
    assert gen.tokens == ref and gen.fallbacks >= 2
