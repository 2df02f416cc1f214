"""Batched plain generation equals the engine's plain decoding and HF generate, row by row."""

import pytest
import torch

from eaglekit.engine import Engine, Sampling, generate_batch, make_target_runner
from eaglekit.errors import EaglekitError
from engine_tiny import one_thread, peaked_model  # noqa: F401 (fixture)

PROMPTS = [[5, 17, 99, 3], [45, 200, 7, 8, 9, 10, 11], [300], [12, 13] * 5, [7, 7, 7]]


@pytest.mark.parametrize("arch", ["llama", "gemma"])   # FAST and GENERIC runners
def test_generate_batch_equals_single_sequence_decoding(arch):
    model = peaked_model(arch)
    engine = Engine(make_target_runner(model, max_len=64), stop_token_ids=[2])
    singles = [engine.generate(p, 10, speculative=False).tokens for p in PROMPTS]
    stop = singles[1][4]                                        # makes row 1 stop early below
    batch = generate_batch(model, PROMPTS, max_new_tokens=10, stop_token_ids=[2], batch_size=2)
    assert [c.tokens for c in batch] == singles
    hf = model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert batch[1].tokens == hf[0, len(PROMPTS[1]):].tolist()
    stopped = generate_batch(model, PROMPTS, max_new_tokens=10, stop_token_ids=[stop], batch_size=3)
    cut = singles[1][:singles[1].index(stop) + 1]
    assert stopped[1].finish_reason == "stop" and stopped[1].tokens == cut
    assert all(c.finish_reason == "length" for i, c in enumerate(stopped) if stop not in c.tokens)


def test_generate_batch_sampling_is_seeded_and_valid():
    model = peaked_model("qwen2")
    sampling = Sampling(temperature=0.9, top_p=0.9)
    a = generate_batch(model, PROMPTS, max_new_tokens=6, sampling=sampling, stop_token_ids=[], seed=1)
    b = generate_batch(model, PROMPTS, max_new_tokens=6, sampling=sampling, stop_token_ids=[], seed=1)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert all(len(c.tokens) == 6 for c in a)


def test_generate_batch_refuses_bad_input():
    model = peaked_model("llama")
    with pytest.raises(EaglekitError, match="stop token"):
        generate_batch(model, PROMPTS, max_new_tokens=4)
    with pytest.raises(EaglekitError, match="empty prompt"):
        generate_batch(model, [[]], max_new_tokens=4, stop_token_ids=[2])
    assert generate_batch(model, [], max_new_tokens=4, stop_token_ids=[2]) == []
