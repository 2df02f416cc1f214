"""Batched plain generation equals the engine's plain decoding and HF generate, row by row; rows
are refilled as answers end (continuous batching); the KV cache's three write forms."""

import pytest
import torch

from eaglekit.data.batch_decoder import BatchDecoder, Request, bucket, generate_batch
from eaglekit.engine import Engine
from eaglekit.errors import EaglekitError
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.runtime.kv import Refill, write_slots
from eaglekit.targets.chat import common_prefix
from engine_tiny import cycling_model, fake_cuda_graphs, one_thread, peaked_model  # noqa: F401 (fixture)

PROMPTS = [[5, 17, 99, 3], [45, 200, 7, 8, 9, 10, 11], [300], [12, 13] * 5, [7, 7, 7]]


@pytest.mark.parametrize("arch", ["llama", "gemma"])  # FAST and GENERIC runners
def test_generate_batch_equals_single_sequence_decoding(arch):
    model = peaked_model(arch)
    engine = Engine(make_target_runner(model, max_len=64), stop_token_ids=[2])
    singles = [engine.generate(p, 10, speculative=False).tokens for p in PROMPTS]
    stop = singles[1][4]  # makes row 1 stop early below
    batch = generate_batch(model, PROMPTS, max_new_tokens=10, stop_token_ids=[2], batch_size=2)
    assert [c.tokens for c in batch] == singles
    hf = model.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert batch[1].tokens == hf[0, len(PROMPTS[1]) :].tolist()
    stopped = generate_batch(model, PROMPTS, max_new_tokens=10, stop_token_ids=[stop], batch_size=3)
    cut = singles[1][: singles[1].index(stop) + 1]
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


def singles_of(model, prompts, new, stops=(), max_len=96):
    engine = Engine(make_target_runner(model, max_len=max_len), stop_token_ids=list(stops))
    return [engine.generate(p, n, speculative=False) for p, n in zip(prompts, new)]


@pytest.mark.parametrize("arch", ["llama", "gemma"])  # FAST and GENERIC runners
def test_continuous_batching_refills_rows_and_equals_batch_one_decoding(arch):
    """More prompts than rows, each with its own limit: a row that ends takes the next prompt while the
    other row goes on, and every answer equals plain batch-1 decoding."""
    model = peaked_model(arch)
    prompts = PROMPTS + [[9, 8, 7, 6, 5, 4, 3, 2], [100, 200]]
    limits = [24, 3, 5, 2, 4, 1, 6]
    stop = singles_of(model, prompts[:1], [24])[0].tokens[9]  # ends some answers early (below)
    for stops in ([], [stop]):
        ref = singles_of(model, prompts, limits, stops)
        runner = make_target_runner(model, max_len=64, batch_size=2)
        decoder = BatchDecoder(runner, sampling=Sampling(), graphs=False, compile=False, chunk=1)
        queue = iter([Request(p, n, key=i) for i, (p, n) in enumerate(zip(prompts, limits))])
        got = dict((r.key, c) for r, c in decoder.serve(lambda queue=queue: next(queue, None), stops))
        assert [got[i].tokens for i in range(len(prompts))] == [g.tokens for g in ref]
        assert [got[i].finish_reason for i in range(len(prompts))] == [g.finish_reason for g in ref]
        assert decoder.refills == len(prompts)
        if not stops:  # static batches of two would run 23 + 4 + 3 + 5 steps; refilled rows end with the
            assert decoder.steps <= 23 + 2  # longest, give or take the round a prefill waits behind the steps
            assert decoder.stats()["answer_tokens"] == sum(limits)


def test_served_follow_ups_and_chunks_of_steps():
    """A request queued after an answer came back (a conversation's next turn) is served in the same
    run; several steps between host checks do not let an ended row run on."""
    model = peaked_model("qwen2")
    first = [[5, 17, 99, 3], [45, 200, 7, 8, 9, 10, 11], [300]]
    ref_first = singles_of(model, first, [7, 3, 5])
    follow = {i: first[i] + ref_first[i].tokens + [42, 43] for i in range(3)}
    ref_follow = singles_of(model, list(follow.values()), [4, 4, 4])
    runner = make_target_runner(model, max_len=64, batch_size=2)
    decoder = BatchDecoder(runner, sampling=Sampling(), graphs=False, compile=False, chunk=5)
    queue = [Request(p, n, key=("first", i)) for i, (p, n) in enumerate(zip(first, [7, 3, 5]))]
    got = {}
    for request, completion in decoder.serve(lambda: queue.pop(0) if queue else None, []):
        got[request.key] = completion.tokens
        kind, i = request.key
        if kind == "first":
            queue.append(Request(follow[i], 4, key=("follow", i)))
    assert [got[("first", i)] for i in range(3)] == [g.tokens for g in ref_first]
    assert [got[("follow", i)] for i in range(3)] == [g.tokens for g in ref_follow]


@pytest.mark.parametrize("arch,refill", [("llama", "eager"), ("llama", "graphs"), ("gemma", "eager")])
def test_a_sessions_next_turn_resumes_its_row_and_answers_as_a_fresh_prefill(arch, refill):
    """A next turn of the same session goes back to its row and prefills only what its prompt adds after
    the tokens the row holds (the last prompt and answer, all but the answer's last token); its answer
    equals batch-1 decoding of the whole prompt. A prompt that rewrites the history resumes only its
    common prefix, and not at all below RESUME_MIN tokens; a request without a session never resumes,
    and a session's last request keeps no row.
    Six sessions end together: five resume in one refill (graphed: padded to 6 rows by a duplicate),
    and 72 slots a row push a graphed refill's padding past the last slot (clamped there)."""
    model = peaked_model(arch)
    first = [[(7 * s + 3 * i) % 250 + 1 for i in range(18 + s)] for s in range(6)]
    ref_first = singles_of(model, first, [5] * 6)
    follow = {s: first[s] + ref_first[s].tokens + [42, 43] for s in range(6)}
    follow[2] = follow[2][:17] + [77] + follow[2][18:]  # the history differs from token 17 on
    follow[5] = follow[5][:3] + [77] + follow[5][4:]  # ... from token 3: too little to resume
    ref_follow = singles_of(model, [follow[s] for s in range(6)], [4] * 6)
    decoder = BatchDecoder(
        make_target_runner(model, max_len=72, batch_size=6),
        sampling=Sampling(),
        graphs=False,
        compile=False,
        chunk=2,
        refill=refill,
        refill_capture_after=0,  # the graph of every bucket, at its first use
    )
    queue = [Request(p, 5, key=("first", s), session=s) for s, p in enumerate(first)]
    got = {}
    for request, completion in decoder.serve(lambda: queue.pop(0) if queue else None, []):
        got[request.key] = completion.tokens
        kind, s = request.key
        if kind == "first":
            queue.insert(0, Request(follow[s], 4, key=("follow", s), session=s, session_ends=True))  # as LocalBackend
            if s == 5:
                queue.append(Request([9, 9, 9], 2, key=("lone", 0)))
    assert [got[("first", s)] for s in range(6)] == [g.tokens for g in ref_first]
    assert [got[("follow", s)] for s in range(6)] == [g.tokens for g in ref_follow]
    resumed = [len(first[s]) + 5 - 1 for s in range(6)]
    resumed[2], resumed[5] = 17, 0
    stats = decoder.stats()
    assert stats["resumed_tokens"] == sum(resumed)
    assert stats["refill_tokens"] == sum(map(len, first)) + 3 + sum(len(follow[s]) - resumed[s] for s in range(6))
    assert not decoder.kept  # the sessions' last turns leave no row waiting
    if refill == "graphs":  # the five resumed rows in one forward of 6 (a duplicate), reading 64 slots
        assert (6, 64, 64) in decoder.refill_steps


def test_an_eager_cpu_refill_splits_prompts_that_would_pad_past_twice_their_tokens():
    """On a CPU a forward costs its padded tokens: a round's prompts of 3 and 40 tokens go in two
    forwards, not one padded to 80; the answers do not change."""
    model = peaked_model("llama")
    prompts = [[5, 6, 7], list(range(10, 50)), [8, 9, 10]]
    ref = singles_of(model, prompts, [3, 3, 3])
    decoder = BatchDecoder(
        make_target_runner(model, max_len=64, batch_size=3), sampling=Sampling(), graphs=False, compile=False
    )
    assert [c.tokens for c in decoder.run(prompts, 3, [])] == [g.tokens for g in ref]
    stats = decoder.stats()
    assert stats["refill_tokens"] == 46 and stats["refill_padded_tokens"] == 3 + 3 + 40


def test_a_refill_padding_cap_splits_graphed_refills_by_length():
    """--refill-padding: a long prompt no longer pads the short ones of its refill to its bucket. The
    three prompts go in three forwards (64 + 64 + 96 padded tokens) instead of one of 3 x 96; the
    answers do not change; a cap below 1 is refused."""
    model = peaked_model("llama")
    prompts = [[5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2] * 9, [8, 9, 10]]

    def run(cap):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=128, batch_size=3),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            refill="graphs",
            refill_padding=cap,
        )
        return [c.tokens for c in decoder.run(prompts, 3, [])], decoder.stats()

    (plain, plain_stats), (capped, capped_stats) = run(0.0), run(2.0)
    assert capped == plain == [g.tokens for g in singles_of(model, prompts, [3, 3, 3])]
    assert plain_stats["refill_padded_tokens"] == 3 * 96 and capped_stats["refill_padded_tokens"] == 64 + 64 + 96
    with pytest.raises(EaglekitError, match="below 1"):
        run(0.5)


def test_graphed_refills_capture_a_bucket_after_its_first_eager_forwards():
    """--refill-capture-after N: a bucket's first N forwards run eagerly, the next one captures its
    graph, and the answers do not change (a bucket used N times or fewer is never captured)."""
    model = peaked_model("llama")
    prompts = PROMPTS + [[9, 8, 7, 6, 5, 4, 3, 2] * 9] + [p[::-1] for p in PROMPTS]

    def run(after):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=128, batch_size=2),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=2,
            refill="graphs",
            refill_capture_after=after,
        )
        return [c.tokens for c in decoder.run(prompts, 3, [])], decoder

    (first, at_first), (late, at_second), (never, uncaptured) = run(0), run(1), run(1000)
    assert first == late == never == [g.tokens for g in singles_of(model, prompts, [3] * len(prompts))]
    uses = uncaptured.bucket_uses  # nothing captured: every forward of every bucket counted
    assert not uncaptured.refill_steps and sum(uses.values()) == uncaptured.stats()["refill_forwards"]
    assert any(n >= 2 for n in uses.values()) and any(n == 1 for n in uses.values())  # the test has both kinds
    assert set(at_first.refill_steps) == set(uses) and at_first.stats()["refill_eager_forwards"] == 0
    assert set(at_second.refill_steps) == {key for key, n in uses.items() if n >= 2}
    assert at_second.stats()["refill_eager_forwards"] == len(uses)
    with pytest.raises(EaglekitError, match="--refill-capture-after -1"):
        run(-1)


def test_common_prefix_of_token_lists():
    assert [
        common_prefix(a, b)
        for a, b in [
            ([], [1]),
            ([1, 2, 3], [1, 2, 3, 4]),
            ([1, 2, 3, 4], [1, 2]),
            ([1, 2, 3, 4, 5], [1, 2, 9, 4, 5]),
            ([7], [8]),
        ]
    ] == [0, 3, 2, 2, 0]
    a = list(range(1000))
    assert all(common_prefix(a, a[:k] + [-1] + a[k + 1 :]) == k for k in range(0, 1000, 37))


def test_graphed_refills_equal_eager_ones():
    """Refills at the graphs' bucketed shapes (prompts padded to a `bucket` >= REFILL_MIN, rows to a
    bucket by sending the last one again; captured on CUDA, run as they are here) give
    the answers eager refills give, also for a next turn's longer prompt; the generic runner refuses them."""
    model = peaked_model("llama")
    first = PROMPTS + [[9, 8, 7, 6, 5, 4, 3, 2] * 9]  # 72 tokens: the 96 bucket
    limits = [9, 3, 5, 2, 4, 6]

    def answers(refill):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=160, batch_size=3),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=2,
            refill=refill,
            refill_capture_after=0,  # the graph of every bucket, at its first use
        )
        queue = [Request(p, n, key=("first", i)) for i, (p, n) in enumerate(zip(first, limits))]
        got = {}
        for request, completion in decoder.serve(lambda: queue.pop(0) if queue else None, [2]):
            got[request.key] = completion.tokens
            if request.key[0] == "first" and request.key[1] < 2:  # a next turn, prefilled later
                queue.append(Request(first[request.key[1]] + completion.tokens + [42], 3, key=("next", request.key[1])))
        return got, decoder

    eager, eager_decoder = answers("eager")
    graphed, decoder = answers("graphs")
    assert graphed == eager and len(eager) == len(first) + 2
    stats, eager_stats = decoder.stats(), eager_decoder.stats()
    assert stats["refills"] == eager_stats["refills"] and stats["refill_tokens"] == eager_stats["refill_tokens"]
    shapes = set(decoder.refill_steps)
    assert all(bucket(r) == r and p in (64, 96) and not c for r, p, c in shapes) and {p for _, p, _ in shapes} == {
        64,
        96,
    }
    assert any(r > 1 for r, _, _ in shapes) and stats["refill_padded_tokens"] > eager_stats["refill_padded_tokens"]
    with pytest.raises(EaglekitError, match="fast runner"):
        BatchDecoder(
            make_target_runner(peaked_model("gemma"), max_len=64, batch_size=2),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            refill="graphs",
        )


def test_refill_buckets_pad_at_most_half_again():
    """Buckets are 2^k and 3 * 2^(k-1): each n pads to the least of them >= n, at most 1.5x n."""
    got = [bucket(n) for n in range(1, 2049)]
    assert got[:13] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert all(n <= b <= max(n * 3 / 2, n + 1) for n, b in enumerate(got, 1))
    assert len(set(got)) == 22


def test_batch_decoder_refuses_what_a_row_cannot_hold():
    model = peaked_model("llama")
    decoder = BatchDecoder(
        make_target_runner(model, max_len=16, batch_size=2), sampling=Sampling(), graphs=False, compile=False
    )
    with pytest.raises(EaglekitError, match="16 slots"):
        decoder.run([[1, 2, 3]], 14, [])
    with pytest.raises(EaglekitError, match="stop ids"):
        decoder.run([[1, 2, 3]], 4, range(20))
    assert [len(c.tokens) for c in decoder.run([[1, 2, 3]] * 3, 13, [])] == [13] * 3


def test_kv_writes_same_slots_own_slots_and_refills():
    store = torch.zeros(3, 2, 6, 4)  # [B, h, L, d]
    new = torch.arange(3 * 2 * 2 * 4, dtype=torch.float).view(3, 2, 2, 4)
    same = write_slots(store.clone(), torch.tensor([1, 4]), new)
    assert torch.equal(same[:, :, [1, 4]], new) and same[:, :, [0, 2, 3, 5]].abs().sum() == 0
    own = write_slots(store.clone(), torch.tensor([[0, 1], [3, 2], [5, 4]]), new)
    assert torch.equal(own[1, :, 3], new[1, :, 0]) and torch.equal(own[1, :, 2], new[1, :, 1])
    assert torch.equal(own[2, :, 5], new[2, :, 0]) and own[2, :, :4].abs().sum() == 0
    cache = store.clone()
    part = new[:2]
    back = write_slots(cache, Refill(torch.tensor([2, 0]), torch.tensor([[0, 1], [1, 0]])), part)
    assert back is part  # a new prompt attends to itself only
    assert torch.equal(cache[2, :, :2], part[0]) and torch.equal(cache[0, :, 1], part[1, :, 0])
    assert cache[1].abs().sum() == 0  # the other row is untouched


def first_loop_end(tokens: list[int], window: int, max_period: int = 64) -> int | None:
    """The shortest prefix whose last `window` tokens repeat a block of p <= window / 2 tokens, all
    inside the answer (what the decoder's loop check looks for), or None."""
    for t in range(len(tokens) + 1):
        for p in range(1, min(window // 2, max_period) + 1):
            if t >= window + p and tokens[t - window : t] == tokens[t - window - p : t - p]:
                return t
    return None


def test_stop_loops_ends_an_answer_where_its_loop_is_found():
    """With stop_loops=W (checked after every step: chunk=1) an answer is the unlimited answer cut at
    the first token where its last W tokens repeat a block, finish_reason "loop"; answers without a
    loop (a period over W / 2) are unchanged, and a prompt's own repeats do not count."""
    short, three, long = [10, 11], [20, 21, 22], list(range(40, 100))
    model = cycling_model([short, three, long])
    prompts = [[11, 10] * 6, [6, 20], [7, 40], [41] * 11 + [42]]  # the first already loops in its prompt
    window = 8

    def serve(stop_loops):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=96, batch_size=3),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=1,
            stop_loops=stop_loops,
        )
        return decoder.run(prompts, 40, [2]), decoder.stats()

    free, _ = serve(0)
    assert free[0].tokens[:4] == [11, 10, 11, 10] and free[2].tokens[:3] == [41, 42, 43]  # the rings
    cut, stats = serve(window)
    ends = [first_loop_end(whole.tokens, window) for whole in free]
    assert ends == [10, 11, None, None]  # period 2 and 3: W + p tokens; none in the long ring
    for whole, got, end in zip(free, cut, ends):
        if end is None:
            assert got.tokens == whole.tokens and got.finish_reason == whole.finish_reason == "length"
        else:
            assert got.tokens == whole.tokens[:end] and got.finish_reason == "loop"
    assert stats["loop_stops"] == 2
    with pytest.raises(EaglekitError, match="stop_loops"):
        BatchDecoder(
            make_target_runner(model, max_len=16, batch_size=2),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            stop_loops=-1,
        )


def test_graphed_refills_and_loop_check_through_the_graph_code_paths(monkeypatch):
    """With stand-in CUDA graphs (captured steps replayed on CPU): the refill graphs are captured per
    bucket on first use (or after its first eager forward) and replayed with each refill's inputs, and the loop check runs as a captured
    step; the answers equal the eager decoder's."""
    model = cycling_model([[10, 11], [20, 21, 22], list(range(40, 100))])
    prompts = [[11, 10] * 6, [6, 20], [7, 40], [41] * 11 + [42], [5, 10], [7, 50, 51]]

    def run(**kw):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=96, batch_size=3),
            sampling=Sampling(),
            compile=False,
            chunk=2,
            stop_loops=8,
            **kw,
        )
        return [(c.tokens, c.finish_reason) for c in decoder.run(prompts, 30, [2])], decoder

    eager, _ = run(graphs=False)
    fake_cuda_graphs(monkeypatch)
    graphed, decoder = run(graphs=True, refill="graphs", refill_capture_after=0)
    assert graphed == eager and "loop" in {reason for _, reason in eager}
    assert decoder.loop_check.graph is not None and decoder.step.graph is not None
    assert decoder.refill_steps and all(step.graph is not None for step, _ in decoder.refill_steps.values())
    late, decoder = run(graphs=True, refill="graphs", refill_capture_after=1)  # eager first, replays after
    assert late == eager and decoder.stats()["refill_eager_forwards"] > 0


def test_eager_cpu_steps_attend_to_the_used_slots_only():
    """An eager CPU step attends to the slots the rows use so far (rounded up to SPAN_ALIGN), not the
    whole cache: the answers equal a step over all L slots, also as the span grows past 64 and 128."""
    model = peaked_model("llama")

    def run(trim):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=320, batch_size=3),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=8,
        )
        assert decoder.trim
        decoder.trim = trim
        return [c.tokens for c in decoder.run(PROMPTS, 150, [2])], decoder

    trimmed, decoder = run(True)
    assert trimmed == run(False)[0] and max(len(t) for t in trimmed) > 128
    assert decoder._span() % 64 == 0 and decoder._span() < decoder.L


def test_answers_are_the_same_whatever_steps_are_queued_ahead_of_the_host(monkeypatch):
    """The ended rows' tokens are copied before a round's first steps are queued and read after them:
    with sessions resuming their rows and any number of steps ahead (on CUDA `next_cover` picks it
    from the device's idle time), every answer equals plain batch-1 decoding, and the stats split
    the host's time."""
    from eaglekit.data import batch_decoder as batch

    class Mark:  # a CUDA event's part the loop uses
        def elapsed_time(self, other):
            return 0.0

        def synchronize(self):
            pass

    model = peaked_model("llama")
    first = [list(range(5, 25)), list(range(45, 70)), list(range(120, 100, -1))]  # 16+ tokens: worth resuming
    ref_first = singles_of(model, first, [30, 11, 25], max_len=128)
    follow = {i: first[i] + ref_first[i].tokens + [42, 43] for i in range(len(first))}
    ref_follow = singles_of(model, list(follow.values()), [19] * len(first), max_len=128)
    for covers in ([1], [7], [3, 1, 6, 2, 7]):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=128, batch_size=3),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=8,
        )
        picks = iter(covers * 100)
        monkeypatch.setattr(decoder, "_mark", Mark)
        monkeypatch.setattr(batch, "next_cover", lambda *args, picks=picks: next(picks))
        queue = [Request(p, n, key=("first", i), session=i) for i, (p, n) in enumerate(zip(first, [30, 11, 25]))]
        got = {}
        for request, completion in decoder.serve(lambda queue=queue: queue.pop(0) if queue else None, []):
            got[request.key] = completion.tokens
            kind, i = request.key
            if kind == "first":
                queue.append(Request(follow[i], 19, key=("follow", i), session=i, session_ends=True))
        assert [got[("first", i)] for i in range(len(first))] == [g.tokens for g in ref_first], covers
        assert [got[("follow", i)] for i in range(len(first))] == [g.tokens for g in ref_follow], covers
        stats = decoder.stats()
        parts = [stats[f"host_{part}_s"] for part in ("wait", "ended", "answers", "take")]
        assert all(p >= 0 for p in parts) and sum(parts) <= stats["wall_s"]
        assert decoder.resumed_tokens > 0  # the follow-ups resumed their rows
        assert stats["cover_steps"] == pytest.approx(sum(covers) / len(covers), abs=1.5)  # the picks were used


def test_the_steps_ahead_of_the_host_fill_the_devices_wait():
    """Idle before the host's work: add the steps that would have filled it; not idle: one fewer, down
    to a quarter of the round; never the whole round."""
    from eaglekit.data.batch_decoder import next_cover

    assert next_cover(4, idle_ms=30.0, step_ms=4.0, base=4, chunk=16) == 12  # 7.5 steps of wait: 8 more
    assert next_cover(12, idle_ms=0.5, step_ms=4.0, base=4, chunk=16) == 11  # hidden: probe one lower
    assert next_cover(4, idle_ms=0.0, step_ms=4.0, base=4, chunk=16) == 4  # never below the quarter
    assert next_cover(14, idle_ms=80.0, step_ms=4.0, base=4, chunk=16) == 15  # never the whole round
    assert next_cover(1, idle_ms=9.0, step_ms=4.0, base=1, chunk=1) == 1  # a round of one step
    assert next_cover(5, idle_ms=9.0, step_ms=0.0, base=4, chunk=16) == 5  # no step time yet


def test_compiled_decode_step_compiles_one_layer_and_answers_as_eager():
    """compile=True on the fast runner compiles each decoder layer (one graph they all share) and leaves
    the rest of the step and the refills eager: Inductor's C++ kernels on CPU, the tokens eager's."""
    from torch._dynamo.utils import counters

    model = peaked_model("llama")
    limits = [12, 3, 7, 5, 2]
    runs = {}
    for compile in (False, True):
        torch._dynamo.reset()
        counters.clear()
        decoder = BatchDecoder(
            make_target_runner(model, max_len=64, batch_size=2, attention="sdpa"),
            sampling=Sampling(),
            graphs=False,
            compile=compile,
            chunk=3,
        )
        queue = iter([Request(p, n, key=i) for i, (p, n) in enumerate(zip(PROMPTS, limits))])
        runs[compile] = {r.key: c.tokens for r, c in decoder.serve(lambda q=queue: next(q, None), [])}
        graphs, ops = counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"]
    assert runs[True] == runs[False] and sorted(map(len, runs[True].values())) == sorted(limits)
    assert graphs == 1  # every layer's decode forward; refills (other shapes) stayed eager
    torch._dynamo.reset()
    counters.clear()
    torch.compile(decoder._step, backend="eager")()  # the whole step traced: both layers and the rest
    assert ops < counters["stats"]["calls_captured"] / 2  # one layer's ops were compiled, not the step's
    assert decoder.runner.layer_calls is None  # outside a step the layers run as they are


def test_compiled_refills_answer_as_eager_ones_in_two_graphs():
    """refill="compiled": each layer under torch.compile with dynamic shapes, beside the decode step's
    static compile of the same layers (as on a GPU). Fresh and resumed refills of any rows and lengths
    run two graphs (sizes 0 and 1 padded away), and every answer equals the eager run's (fp32,
    Inductor's C++ kernels on CPU)."""
    from torch._dynamo.utils import counters

    model = peaked_model("llama")
    first = [p * (18 // len(p) + 1) for p in PROMPTS]  # 18+ tokens: a next turn resumes (RESUME_MIN)
    runs, graphs = {}, None
    for refill in ("eager", "compiled"):
        torch._dynamo.reset()
        counters.clear()
        decoder = BatchDecoder(
            make_target_runner(model, max_len=96, batch_size=3, attention="sdpa"),
            sampling=Sampling(),
            graphs=False,
            compile=refill == "compiled",
            chunk=2,
            refill=refill,
            refill_capture_after=0,  # the graph of every bucket, at its first use
        )
        queue = [Request(p, 3 + i, key=("first", i), session=i) for i, p in enumerate(first)]
        got = {}
        for request, completion in decoder.serve(lambda q=queue: q.pop(0) if q else None, []):
            got[request.key] = completion.tokens
            kind, i = request.key
            if kind == "first":  # the next turn: its row's cache holds the prompt and answer (resumed)
                queue.append(
                    Request(
                        first[i] + completion.tokens + [42] * (i % 2 + 1),
                        4,
                        key=("next", i),
                        session=i,
                        session_ends=True,
                    )
                )
        runs[refill] = got
        if refill == "compiled":
            graphs, resumed = counters["stats"]["unique_graphs"], decoder.resumed_tokens
    assert runs["compiled"] == runs["eager"] and len(runs["eager"]) == 2 * len(first)
    assert resumed > 0 and graphs == 1 + 2  # the decode step's layer; prompts alone, and prompts reading cached slots


def test_compiled_refills_with_one_row():
    """One row: the build's compile and every refill send it twice (sizes of 1 compile apart)."""
    model = peaked_model("llama")
    prompts = PROMPTS[:3]
    got = {}
    for refill in ("eager", "compiled"):
        decoder = BatchDecoder(
            make_target_runner(model, max_len=64, batch_size=1, attention="sdpa"),
            sampling=Sampling(),
            graphs=False,
            compile=False,
            chunk=2,
            refill=refill,
            refill_capture_after=0,  # the graph of every bucket, at its first use
        )
        got[refill] = [c.tokens for c in decoder.run(prompts, 6, [])]
        assert decoder.stats()["refills"] == len(prompts)  # the build's compile is not counted
    assert got["compiled"] == got["eager"]
