"""The generate stage on the engine's continuous batching: turns are streamed to the decoder, a
conversation's next turn follows its own answer, and the answers equal HF's static batches."""

from __future__ import annotations

import pytest

from eaglekit.data.generators import EngineGenerator, EngineSettings, make_generator
from eaglekit.data.local_backend import LocalBackend
from eaglekit.data.records import Conversation, Prompt
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets import load_target
from engine_tiny import one_thread  # noqa: F401 (fixture)

TURNS = [
    ["Hello!", "Count from one to ten.", "Solve 12 * 7."],
    ["What is the capital of France?"],
    ["Write a Python function that adds two numbers.", "And in Rust?"],
    ["The quick brown fox?"],
    ["How can I help you today?", "Why?"],
]


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    return load_target(tiny_target_dir)


def answer(target, generator, *, batch_size=2, max_new_tokens=9, context_length=512):
    backend = LocalBackend(
        target.tokenizer, generator, max_new_tokens=max_new_tokens, batch_size=batch_size, context_length=context_length
    )
    prompts = [
        Prompt(id=str(i), source="t", turns=t, system="Be brief." if i % 2 else None) for i, t in enumerate(TURNS)
    ]
    batches = list(backend.run([Conversation(p, "train") for p in prompts]))
    return {c.prompt.id: c.to_json() for batch in batches for c in batch}, batches


def test_streamed_turns_equal_static_hf_batches(tiny):
    engine = make_generator("engine", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2)
    assert engine.continuous
    streamed, batches = answer(tiny, engine)
    static, _ = answer(tiny, make_generator("hf", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2))
    assert streamed == static and len(streamed) == len(TURNS)
    assert all(len(r["meta"]["turns"]) == len(TURNS[int(i)]) for i, r in streamed.items())
    assert all(len(b) <= 2 for b in batches)  # yielded as they finish, a batch's worth at most
    assert engine.builds == 1 and engine._decoder.refills == sum(len(t) for t in TURNS)


def test_a_turn_longer_than_the_rows_waits_for_a_larger_decoder(tiny):
    """Later turns outgrow a small decoder: they wait until the rows drain, the decoder is rebuilt
    once, larger, and every answer is still what batch-1 decoding gives."""
    small = EngineGenerator(tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2, max_len=48)
    got, _ = answer(tiny, small)
    ref, _ = answer(tiny, EngineGenerator(tiny.model, tiny.stop_token_ids, Sampling(), batch_size=1, max_len=512))
    assert got == ref
    assert small.builds == 2 and small.max_len > 48


def test_cache_slots_give_every_turn_one_cache(tiny):
    """`generate --cache-slots`: the first decoder holds that many slots, so no later turn rebuilds it."""
    sized = make_generator(
        "engine", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2, engine=EngineSettings(cache_slots=512)
    )
    got, _ = answer(tiny, sized)
    ref, _ = answer(tiny, make_generator("engine", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2))
    assert got == ref and sized.builds == 1 and sized.max_len == 512


def test_context_limit_on_the_streamed_path(tiny):
    """A turn with no room left in the context ends its conversation as context_length; the rest go on."""
    got, _ = answer(
        tiny, make_generator("engine", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2), context_length=40
    )
    ref, _ = answer(
        tiny, make_generator("hf", tiny.model, tiny.stop_token_ids, Sampling(), batch_size=2), context_length=40
    )
    assert got == ref
    assert any(r["meta"]["finish_reason"] == "context_length" for r in got.values())
