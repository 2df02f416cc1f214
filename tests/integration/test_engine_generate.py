"""Speculation equals plain decoding on the real SmolLM2, and under torch.compile (Inductor) on tiny targets."""

import pytest
import torch

from eaglekit.engine import DraftRunner, Engine, OracleDrafter, SpecConfig
from eaglekit.runtime import Sampling, make_target_runner
from engine_tiny import (
    AUX,
    CHAIN,
    PROMPTS,
    TREE,
    noisy,
    one_thread,  # noqa: F401 (fixture)
    peaked_model,
    random_draft,
)

NEW, L = 24, 96


@pytest.mark.slow
def test_smollm2_greedy_speculation_equals_plain(smollm2_dir):
    from eaglekit.targets import load_target

    target = load_target(smollm2_dir)
    from eaglekit.targets.chat import prompt_ids

    prompt = prompt_ids(target.tokenizer, [{"role": "user", "content": "Name three colors."}])
    L2 = len(prompt) + 64
    runner = make_target_runner(target.model, max_len=L2, aux_layer_ids=[1, 14, 26])
    assert runner.kind == "fast"
    ref = Engine(runner, stop_token_ids=target.stop_token_ids).generate(prompt, 16, speculative=False).tokens
    hf = target.model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert ref == hf[0, len(prompt) : len(prompt) + len(ref)].tolist()
    for spec in (SpecConfig(mode="chain", k=4), SpecConfig(mode="tree", depth=4, top_k=4, total_tokens=16)):
        oracle = OracleDrafter(
            noisy(prompt + ref, len(prompt), 5, runner.vocab_size),
            spec=spec,
            vocab_size=runner.vocab_size,
            max_len=L2,
            device="cpu",
        )
        gen = Engine(runner, drafter=oracle, spec=spec, stop_token_ids=target.stop_token_ids).generate(prompt, 16)
        assert gen.tokens == ref and gen.tau > 1.5
    spec = SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10)
    draft = DraftRunner(
        random_draft(target.model, draft_vocab=4096, aux=[1, 14, 26]), spec=spec, sampling=Sampling(), max_len=L2
    )
    gen = Engine(runner, drafter=draft, spec=spec, stop_token_ids=target.stop_token_ids).generate(prompt, 16)
    assert gen.tokens == ref


@pytest.mark.slow
def test_compiled_tree_engine_equals_plain_decoding():
    """The steps under torch.compile (as on GPU, without the CUDA graphs): tree speculation with
    compaction of the stacked KV store gives the plain greedy tokens."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = Engine(target).generate(PROMPTS[0], NEW, speculative=False).tokens
    oracle = OracleDrafter(
        noisy(PROMPTS[0] + ref, len(PROMPTS[0]), 4, target.vocab_size),
        spec=TREE,
        vocab_size=target.vocab_size,
        max_len=L,
        device="cpu",
    )
    gen = Engine(target, drafter=oracle, spec=TREE, compile=True).generate(PROMPTS[0], NEW)
    assert gen.tokens == ref and any(0 < a < TREE.max_depth for a in gen.accept_lengths)


@pytest.mark.slow
def test_compiled_draft_runner_cycle_equals_plain_decoding():
    """A real draft's steps under torch.compile use the few-row kernels (matvec linears, reduce
    attention, as on GPU); the fused greedy cycle, several cycles a host read, gives the plain tokens."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = Engine(target).generate(PROMPTS[0], NEW, speculative=False).tokens
    draft = DraftRunner(random_draft(model), spec=CHAIN, sampling=Sampling(), max_len=L)
    from eaglekit.runtime.kernels import SMALL_ROWS

    assert (draft.attention, draft.linear.keywords["max_rows"]) == ("reduce", SMALL_ROWS)
    gen = Engine(target, drafter=draft, spec=CHAIN, compile=True, cycle_chunk=3).generate(PROMPTS[0], NEW)
    assert gen.tokens == ref and len(gen.accept_lengths) >= NEW // (CHAIN.k + 1)


@pytest.mark.slow
def test_compiled_cycle_with_unrolled_matvec_for_every_row_equals_plain_decoding():
    """`small_rows` covering the verify and the catch-up: every few-row linear runs as unrolled
    matvec reductions inside torch.compile, and the tokens stay plain greedy's (a chain: the tree's
    levels take the same forms, and a second compile costs CI a minute)."""
    spec = CHAIN
    model = peaked_model("llama")
    rows = spec.k + 1 if spec.mode == "chain" else spec.total_tokens
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX, small_rows=rows)
    ref = (
        Engine(make_target_runner(model, max_len=L, aux_layer_ids=AUX))
        .generate(PROMPTS[0], NEW, speculative=False)
        .tokens
    )
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L, small_rows=rows)
    assert target.small_rows == rows and draft.linear.keywords["max_rows"] == rows
    gen = Engine(target, drafter=draft, spec=spec, compile=True).generate(PROMPTS[0], NEW)
    assert gen.tokens == ref


@pytest.mark.slow
def test_compiled_tree_cycle_with_reduce_attention_for_every_row_equals_plain_decoding():
    """`attention_rows` above the tree's size: the verify and the draft's levels attend through the
    reduce form inside torch.compile (linears stay one-row matvec), and the tokens stay plain greedy's."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX, attention_rows=64)
    assert target.attention_rows == 64 and target.layers[0].attention_rows == 64 and target.small_rows == 1
    ref = (
        Engine(make_target_runner(model, max_len=L, aux_layer_ids=AUX))
        .generate(PROMPTS[0], NEW, speculative=False)
        .tokens
    )
    draft = DraftRunner(random_draft(model), spec=TREE, sampling=Sampling(), max_len=L, attention_rows=64)
    gen = Engine(target, drafter=draft, spec=TREE, compile=True).generate(PROMPTS[0], NEW)
    assert gen.tokens == ref
