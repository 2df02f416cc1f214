"""The plain fallback (SpecConfig.plain_fallback): a generation whose cycles do not pay decodes
plainly for a while, catches the draft up, and probes again; greedy tokens stay plain greedy's
(chain and tree, eager, graph paths and compiled), the draft's cache after a fallback is the one a
whole catch-up gives, and sampling stays the target's distribution."""

from dataclasses import replace

import pytest
import torch

from eaglekit.engine import DraftRunner, Engine, OracleDrafter, SpecConfig
from eaglekit.engine.generate import PROBE_CYCLES
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.runtime.kv import cache_mask, causal_block
from engine_tiny import (
    AUX,
    PROMPTS,
    fake_cuda_graphs,
    one_thread,  # noqa: F401 (fixture)
    peaked_model,
    random_draft,
)

CHAIN = SpecConfig(mode="chain", k=3, plain_fallback=True)
TREE = SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10, plain_fallback=True)
SPECS = pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
NEW = 48
L = 128


def plain_reference(target, prompt=PROMPTS[0], new=NEW):
    return Engine(target).generate(prompt, new, speculative=False).tokens


def wrong_middle(prompt: list[int], ref: list[int], start: int, stop: int, vocab: int) -> list[int]:
    """prompt + ref with answer tokens start .. stop-1 replaced: an oracle right, then wrong, then right."""
    out = list(ref)
    for i in range(start, stop):
        out[i] = (out[i] + 1) % vocab
    return prompt + out


@SPECS
def test_weak_draft_falls_back_to_plain_steps_and_keeps_the_tokens(spec):
    """A random draft (tau about 1) against a cycle that costs 2 plain steps: after the first
    probe the answer is decoded plainly, with probes between growing windows, token for token plain
    greedy's; a cost below 1 never falls back, and neither does `plain_fallback=False`."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    for prompt in PROMPTS[:2]:
        ref = plain_reference(target, prompt)
        gen = Engine(target, drafter=draft, spec=spec, cycle_cost=2.0, fallback_window=4).generate(prompt, NEW)
        assert gen.tokens == ref
        assert gen.fallbacks >= 2 and gen.plain_tokens >= NEW // 2 and gen.cycle_cost == 2.0
        # every cycle is a probe's: PROBE_CYCLES after each (re)start, the last one maybe cut short
        assert len(gen.accept_lengths) <= PROBE_CYCLES * (gen.fallbacks + 1)
    never = Engine(target, drafter=draft, spec=spec, cycle_cost=0.5, fallback_window=4).generate(prompt, NEW)
    off = Engine(target, drafter=draft, spec=replace(spec, plain_fallback=False)).generate(prompt, NEW)
    asked = Engine(target, drafter=draft, spec=spec, cycle_cost=2.0).generate(prompt, NEW, plain_fallback=False)
    for g in (never, off, asked):
        assert g.tokens == ref and g.plain_tokens == 0 and g.fallbacks == 0
    assert never.accept_lengths == off.accept_lengths == asked.accept_lengths


@SPECS
def test_a_draft_that_recovers_is_probed_back_into_speculation(spec):
    """An oracle wrong on answer tokens 8..23 only: the engine falls back in the wrong stretch and
    speculates again, accepting whole chains, once a probe finds the draft right."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    prompt = PROMPTS[0]
    ref = plain_reference(target, prompt, 64)
    oracle = OracleDrafter(
        wrong_middle(prompt, ref, 8, 24, target.vocab_size),
        spec=spec,
        vocab_size=target.vocab_size,
        max_len=L,
        device="cpu",
    )
    gen = Engine(target, drafter=oracle, spec=spec, cycle_cost=2.0, fallback_window=4).generate(prompt, 64)
    assert gen.tokens == ref and gen.fallbacks >= 1 and 0 < gen.plain_tokens < 32
    # after the last fallback the probe passed: the answer ends speculating, whole paths accepted
    assert gen.accept_lengths[-3:-1] == [spec.max_depth] * 2


@SPECS
def test_draft_cache_after_fallback_windows_equals_a_whole_catch_up(spec):
    """The window catch-up writes the draft's entries from the plain steps' aux rows: its cache over
    the committed positions equals one catch-up over the whole sequence from the target's aux states."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    prompt = PROMPTS[0]
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    engine = Engine(target, drafter=draft, spec=spec, cycle_cost=2.0, fallback_window=4)
    gen = engine.generate(prompt, NEW)
    assert gen.plain_tokens >= 16
    n = int(engine.n)  # the draft holds entries for positions < n
    seq = torch.tensor(prompt + gen.tokens)
    assert n > len(prompt) + gen.plain_tokens // 2
    pos = torch.arange(n)
    _, aux = target(seq[None, :n], pos[None], pos, cache_mask(causal_block(n), 0, 0, L))
    fresh = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    fresh.catch_up(seq[1 : n + 1], aux[0], 0, n - 1)
    for got, want in ((draft.cache.k, fresh.cache.k), (draft.cache.v, fresh.cache.v)):
        torch.testing.assert_close(got[:, :, :n], want[:, :, :n], rtol=1e-4, atol=1e-4)


@SPECS
def test_timed_cost_and_stop_token_with_fallback(spec):
    """Without a given cost the engine times its chunks (a number comes back); a stop token inside a
    plain window ends the answer as plain decoding does."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = plain_reference(target)
    draft = DraftRunner(random_draft(model), spec=spec, sampling=Sampling(), max_len=L)
    gen = Engine(target, drafter=draft, spec=spec, fallback_window=4).generate(PROMPTS[0], NEW)
    assert gen.tokens == ref and gen.cycle_cost > 0
    stop = ref[30]
    cut = ref[: ref.index(stop) + 1]
    engine = Engine(target, drafter=draft, spec=spec, cycle_cost=2.0, fallback_window=4, stop_token_ids=[stop])
    gen = engine.generate(PROMPTS[0], NEW)
    assert gen.tokens == cut and gen.finish_reason == "stop" and gen.plain_tokens > 0


def test_fallback_steps_build_no_tensor_from_host_data():
    """The decode step (which keeps aux rows here) and the window catch-up are captured too, the
    catch-up uncompiled: neither may copy host data into a tensor, which CUDA graph capture refuses
    (`aten.lift_fresh`, see tests/unit/test_engine_capture_safe.py)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostTensors(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.lift_fresh.default:
                self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    draft = DraftRunner(random_draft(model), spec=TREE, sampling=Sampling(), max_len=L)
    engine = Engine(target, drafter=draft, spec=TREE, compile=False, cycle_cost=2.0, fallback_window=4)
    spy, calls = HostTensors(), {}
    for step in (engine.decode, engine.window_catch_up):

        def spied(fn=step.fn, name=step.name):
            calls[name] = calls.get(name, 0) + 1
            with spy:
                fn()

        step.fn = spied
    engine.generate(PROMPTS[0], 24)
    assert calls.get("decode", 0) >= 8 and calls.get("window catch-up", 0) >= 2
    assert spy.seen == []


def test_fallback_through_the_graph_paths(monkeypatch):
    """The decode and window catch-up steps are captured with the speculation steps (lazy capture,
    state reset first) and replayed in a fallback, on CPU with a fake CUDA graph."""
    fake_cuda_graphs(monkeypatch)
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    ref = plain_reference(target)
    draft = DraftRunner(random_draft(model), spec=TREE, sampling=Sampling(), max_len=L)
    engine = Engine(target, drafter=draft, spec=TREE, prefill_chunk=5, cycle_cost=2.0, fallback_window=4)
    engine.graphs = True
    steps = [engine.prefill, *engine.speculation_steps()]
    assert engine.decode in steps and engine.window_catch_up in steps
    for step in steps:
        step.use_graph = True
    gen = engine.generate(PROMPTS[0], NEW)
    assert gen.tokens == ref and gen.fallbacks >= 2
    assert all(step.graph is not None for step in steps)


@SPECS
def test_sampled_fallback_is_reproducible(spec):
    """Sampling through fallback windows and probes (a sampled chain carries its q across them): a
    seed gives the same answer, and it is not the greedy one."""
    model = peaked_model("llama")
    target = make_target_runner(model, max_len=L, aux_layer_ids=AUX)
    sampling = Sampling(temperature=1.0)
    draft = DraftRunner(random_draft(model), spec=spec, sampling=sampling, max_len=L)
    engine = Engine(target, drafter=draft, spec=spec, sampling=sampling, cycle_cost=2.0, fallback_window=4)
    a, b = engine.generate(PROMPTS[0], NEW, seed=7), engine.generate(PROMPTS[0], NEW, seed=7)
    assert a.tokens == b.tokens and a.accept_lengths == b.accept_lengths and a.fallbacks >= 2
    assert len(a.tokens) == NEW and a.tokens != plain_reference(target)
