"""The engine end to end on CPU: greedy speculation is token-identical to plain greedy decoding
(chain and tree, FAST and GENERIC runners, random / oracle / partly wrong drafts), stop tokens,
KV compaction, and sampling (reproducible, and the target's distribution on a tiny vocabulary)."""

import pytest
import torch

from eaglekit.engine import DraftRunner, Engine, OracleDrafter, SpecConfig
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.runtime.kv import cache_mask, causal_block
from engine_tiny import (
    AUX,
    CHAIN,
    PROMPTS,
    TREE,
    chi_square_pvalue,
    fake_cuda_graphs,
    noisy,
    one_thread,  # noqa: F401 (fixture)
    peaked_model,
    random_draft,
)

NEW = 24
L = 96


def plain_outputs(engine, prompts=PROMPTS, new=NEW):
    return [engine.generate(p, new, speculative=False).tokens for p in prompts]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma", "qwen3_moe"])
def test_greedy_speculation_equals_plain_decoding(arch):
    model = peaked_model(arch)
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    reference = plain_outputs(Engine(target))
    hf = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    assert reference[0] == hf[0, len(PROMPTS[0]) :].tolist()
    V = target.vocab_size
    for spec in (CHAIN, TREE):
        draft = DraftRunner(random_draft(model, draft_vocab=V // 2), spec=spec, sampling=Sampling(), max_len=L)
        engine = Engine(target, drafter=draft, spec=spec)
        for prompt, ref in zip(PROMPTS, reference):
            assert engine.generate(prompt, NEW).tokens == ref
        for prompt, ref in zip(PROMPTS, reference):
            perfect = OracleDrafter(prompt + ref, spec=spec, vocab_size=V, max_len=L, device="cpu")
            gen = Engine(target, drafter=perfect, spec=spec).generate(prompt, NEW)
            assert gen.tokens == ref
            assert gen.accept_lengths[:-1] == [spec.max_depth] * (len(gen.accept_lengths) - 1)
            partly = OracleDrafter(
                noisy(prompt + ref, len(prompt), 3, V), spec=spec, vocab_size=V, max_len=L, device="cpu"
            )
            gen = Engine(target, drafter=partly, spec=spec).generate(prompt, NEW)
            assert gen.tokens == ref
            assert any(0 < a < spec.max_depth for a in gen.accept_lengths)


def test_stop_token_ends_both_modes_identically():
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = Engine(target).generate(PROMPTS[0], NEW, speculative=False).tokens
    stop = ref[6]
    cut = ref[: ref.index(stop) + 1]
    plain = Engine(target, stop_token_ids=[stop]).generate(PROMPTS[0], NEW, speculative=False)
    assert plain.tokens == cut and plain.finish_reason == "stop"
    oracle = OracleDrafter(PROMPTS[0] + ref, spec=TREE, vocab_size=target.vocab_size, max_len=L, device="cpu")
    spec = Engine(target, drafter=oracle, spec=TREE, stop_token_ids=[stop]).generate(PROMPTS[0], NEW)
    assert spec.tokens == cut and spec.finish_reason == "stop"
    short = Engine(target, drafter=oracle, spec=TREE).generate(PROMPTS[0], 5)
    assert short.tokens == ref[:5] and short.finish_reason == "length"


def test_cache_after_compaction_equals_a_fresh_forward():
    model = peaked_model("qwen3")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    prompt = PROMPTS[0]
    ref = Engine(target).generate(prompt, NEW, speculative=False).tokens
    oracle = OracleDrafter(
        noisy(prompt + ref, len(prompt), 4, target.vocab_size),
        spec=TREE,
        vocab_size=target.vocab_size,
        max_len=L,
        device="cpu",
    )
    engine = Engine(target, drafter=oracle, spec=TREE)
    out = [int(engine._prefill_speculation(prompt))]
    moved = 0
    for _ in range(4):  # drive the greedy cycles by hand
        engine.cycle()
        count = int(engine.acc[0])
        path = engine.acc[2 : 2 + count + 1].tolist()
        moved += path != list(range(count + 1))  # the accepted path was not in place
    assert moved  # compaction really moved KV
    n = int(engine.n)
    out += engine.out[len(prompt) : n].tolist()  # out[p] = the token after position p
    assert engine.counts[:4].sum() + 4 == n - len(prompt)
    committed = prompt + out[:-1]  # the newest token is not cached yet
    assert len(committed) == n and out == ref[: len(out)]
    got, _ = target(
        torch.tensor([[out[-1]]]), torch.tensor([[n]]), torch.tensor([n]), cache_mask(causal_block(1), n, n, L)
    )
    with torch.no_grad():
        fresh = model(input_ids=torch.tensor([committed + [out[-1]]])).logits[0, -1]
    torch.testing.assert_close(got[0, 0], fresh, rtol=1e-4, atol=5e-5 * float(fresh.abs().max()))


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_sampling_runs_and_is_reproducible(spec):
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    sampling = Sampling(temperature=0.8, top_p=0.95, top_k=50)
    draft = DraftRunner(random_draft(model), spec=spec, sampling=sampling, max_len=L)
    engine = Engine(target, drafter=draft, spec=spec, sampling=sampling)
    a = engine.generate(PROMPTS[0], NEW, seed=3)
    b = engine.generate(PROMPTS[0], NEW, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) == NEW
    assert all(0 <= t < target.vocab_size for t in a.tokens)
    plain = engine.generate(PROMPTS[0], NEW, speculative=False, seed=3)
    assert len(plain.tokens) == NEW


@pytest.mark.parametrize(
    "spec",
    [SpecConfig(mode="chain", k=2), SpecConfig(mode="tree", depth=2, top_k=3, total_tokens=8)],
    ids=["chain", "tree"],
)
def test_engine_sampling_follows_the_target_distribution(spec):
    """Tiny vocabulary (8): the first two tokens of speculative sampling through the whole engine
    (prefill token, then one cycle) follow p(x1) p(x2 | x1) computed by the HF model."""
    V = 8
    model = peaked_model("llama", vocab_size=V, std=0.15)
    target = make_target_runner(model, max_len=32, aux_layer_ids=AUX)
    sampling = Sampling(temperature=1.0)
    draft = DraftRunner(random_draft(model, seed=1), spec=spec, sampling=sampling, max_len=32)
    engine = Engine(target, drafter=draft, spec=spec, sampling=sampling)
    prompt = [3, 1, 4]
    counts = torch.zeros(V * V, dtype=torch.float64)
    accepted = 0
    for seed in range(700):
        gen = engine.generate(prompt, 2, seed=seed)
        counts[gen.tokens[0] * V + gen.tokens[1]] += 1
        accepted += gen.accept_lengths[0] > 0
    with torch.no_grad():
        p1 = model(input_ids=torch.tensor([prompt])).logits[0, -1].double().softmax(-1)
        rows = torch.tensor([prompt + [x] for x in range(V)])
        p2 = model(input_ids=rows).logits[:, -1].double().softmax(-1)  # [V, V]
    exact = (p1[:, None] * p2).flatten()
    assert accepted > 40  # drafts were accepted
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_graph_mode_paths_with_a_fake_cuda_graph(monkeypatch):
    """The graph code paths (lazy capture, state reset before capture, replay) on CPU."""
    fake_cuda_graphs(monkeypatch)
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    reference = plain_outputs(Engine(target), PROMPTS[:2])
    draft = DraftRunner(random_draft(model), spec=TREE, sampling=Sampling(), max_len=L)
    engine = Engine(target, drafter=draft, spec=TREE, prefill_chunk=5)
    engine.graphs = True
    for step in (engine.prefill, engine.decode, engine.proposal, engine.cycle):
        step.use_graph = True
    for prompt, ref in zip(PROMPTS[:2], reference):
        assert engine.generate(prompt, NEW, speculative=False).tokens == ref
        assert engine.generate(prompt, NEW).tokens == ref
    assert all(step.graph is not None for step in (engine.prefill, engine.decode, engine.proposal, engine.cycle))
    sampling = Sampling(temperature=0.8)  # sampling accepts on the device too
    eager = Engine(
        target,
        drafter=DraftRunner(random_draft(model), spec=TREE, sampling=sampling, max_len=L),
        spec=TREE,
        sampling=sampling,
    ).generate(PROMPTS[0], NEW, seed=1)
    engine = Engine(
        target,
        drafter=DraftRunner(random_draft(model), spec=TREE, sampling=sampling, max_len=L),
        spec=TREE,
        sampling=sampling,
    )
    engine.graphs = True
    for step in engine.speculation_steps():
        step.use_graph = True
    assert engine.generate(PROMPTS[0], NEW, seed=1).tokens == eager.tokens
    assert all(step.graph is not None for step in (engine.proposal, engine.cycle))


def test_settle_oracle_replays_the_engines_own_output():
    """A reference that leaves the greedy path (as bf16 rounding does on GPU) is replaced by the
    speculative output, after which the oracle is accepted in full."""
    from eaglekit.bench.run import settle_oracle

    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    prompt = PROMPTS[0]
    ref = Engine(target).generate(prompt, NEW, speculative=False).tokens
    wrong = noisy(prompt + ref, len(prompt), 4, target.vocab_size)[len(prompt) :]
    oracle = OracleDrafter(prompt + wrong, spec=TREE, vocab_size=target.vocab_size, max_len=L, device="cpu")
    engine = Engine(target, drafter=oracle, spec=TREE)
    settled, rounds = settle_oracle(engine, oracle, prompt, wrong, NEW)
    assert rounds == 2 and settled == ref
    gen = engine.generate(prompt, NEW)
    assert gen.accept_lengths[:-1] == [TREE.max_depth] * (len(gen.accept_lengths) - 1)
    assert settle_oracle(engine, oracle, prompt, ref, NEW) == (ref, 1)


@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_chunked_prefill_gives_the_same_answers(chunk):
    """The prompt prefilled in pieces (as the captured prefill step does on GPU; 64 > the prompt, so
    one padded piece) gives the whole-prompt prefill's tokens, plain and speculative (the draft's
    catch-up reads the pieces' aux states), and a prompt near the cache's end pads past it safely."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    reference = plain_outputs(Engine(target))
    draft = DraftRunner(random_draft(model), spec=CHAIN, sampling=Sampling(), max_len=L)
    whole = Engine(target, drafter=draft, spec=CHAIN)
    pieces = Engine(target, drafter=draft, spec=CHAIN, prefill_chunk=chunk)
    for prompt, ref in zip(PROMPTS, reference):
        assert pieces.generate(prompt, NEW, speculative=False).tokens == ref
        spec = pieces.generate(prompt, NEW)
        assert spec.tokens == ref and spec.accept_lengths == whole.generate(prompt, NEW).accept_lengths
    long_prompt = (PROMPTS[0] * 20)[: L - 4]
    assert (
        pieces.generate(long_prompt, 3, speculative=False).tokens
        == Engine(target).generate(long_prompt, 3, speculative=False).tokens
    )
