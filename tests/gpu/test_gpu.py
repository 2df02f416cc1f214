"""The GPU tier: the engine's CUDA paths (torch.compile + CUDA graphs, flex attention, graphed
refills, the captured loop check) give the tokens the eager CPU paths give. Never runs in CI (no GPU there); on the device:

    python -m pytest -m gpu tests/gpu/test_gpu.py

fp32 everywhere, so outputs must be token-identical; tiny peaked targets keep compiles short.
"""

import copy

import pytest
import torch

from eaglekit.data.batch_decoder import BatchDecoder, Request, batch_runner
from eaglekit.engine import Engine
from eaglekit.engine.draft_runner import DraftRunner
from eaglekit.engine.spec import SpecConfig
from eaglekit.runtime import Sampling, make_target_runner
from engine_tiny import AUX, PROMPTS, cycling_model, peaked_model, random_draft
from oracle_draft import repeat_draft

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
NEW = 24
CHAIN = SpecConfig(mode="chain", k=4)
TREE = SpecConfig(mode="tree", depth=4, top_k=3, total_tokens=10)


def on(device: str, arch: str = "llama"):
    """A copy of the cached tiny target on `device` (the cache's model stays on the CPU)."""
    return copy.deepcopy(peaked_model(arch)).to(device)


def test_plain_and_speculative_engines_on_cuda_equal_the_cpu():
    cpu = Engine(make_target_runner(peaked_model("llama"), max_len=128, aux_layer_ids=AUX))
    reference = [cpu.generate(p, NEW, speculative=False).tokens for p in PROMPTS]
    model = on("cuda")
    target = make_target_runner(model, max_len=128, aux_layer_ids=AUX)
    plain = Engine(target, graphs=True, compile=True)
    assert [plain.generate(p, NEW, speculative=False).tokens for p in PROMPTS] == reference
    for spec in (CHAIN, TREE):
        draft = DraftRunner(random_draft(model).to("cuda"), spec=spec, sampling=Sampling(), max_len=128)
        engine = Engine(target, drafter=draft, spec=spec, graphs=True, compile=True)
        assert [engine.generate(p, NEW).tokens for p in PROMPTS] == reference, spec.label()


def test_the_recipes_shapes_compile_at_a_real_vocabulary():
    """Inductor's kernels depend on sizes: a one-row top-k over a tiny model's vocabulary stays one
    reduction, over a real draft vocabulary it is split, and a tree build that compiled on the tiny
    models failed there (torch 2.11, docs/results/2026-12-07-cpu-tree-build). SmolLM2's vocabulary and
    a 16k draft vocabulary, the recipe's tree, the sweep's large tree and a chain of 5, compiled and
    captured, give plain CUDA decoding's tokens (fp32)."""
    model = copy.deepcopy(peaked_model("llama", seed=3, vocab_size=49152)).to("cuda")
    target = make_target_runner(model, max_len=128, aux_layer_ids=AUX)
    reference = [Engine(target, graphs=True, compile=True).generate(p, NEW, speculative=False).tokens for p in PROMPTS]
    for spec in (
        SpecConfig(mode="tree", depth=4, top_k=4, total_tokens=16),
        SpecConfig(mode="tree", depth=6, top_k=8, total_tokens=32),
        SpecConfig(mode="chain", k=5),
    ):
        draft = DraftRunner(
            random_draft(model, draft_vocab=16384).to("cuda"), spec=spec, sampling=Sampling(), max_len=128
        )
        engine = Engine(target, drafter=draft, spec=spec, graphs=True, compile=True)
        assert [engine.generate(p, NEW).tokens for p in PROMPTS] == reference, spec.label()


def test_an_eagle31_draft_on_cuda_accepts_what_the_cpu_accepts():
    """EAGLE-3.1's layout (fc_norm + norm_output) compiled and captured: the repeat oracle, whose per-aux
    norms matter (tests/helpers/oracle_draft.py), gives the eager CPU engine's tokens and accepted counts."""
    cpu_model = peaked_model("llama", std=0.1)
    draft = repeat_draft(cpu_model, draft_vocab=cpu_model.config.vocab_size, fc_norm=True, norm_output=True).eval()
    aux = list(draft.config.aux_layer_ids)

    def run(model, draft, **kw):
        drafter = DraftRunner(draft, spec=CHAIN, sampling=Sampling(), max_len=128)
        engine = Engine(make_target_runner(model, max_len=128, aux_layer_ids=aux), drafter=drafter, spec=CHAIN, **kw)
        return [(g.tokens, g.accept_lengths) for g in (engine.generate(p, NEW) for p in PROMPTS)]

    expected = run(cpu_model, draft)
    assert sum(sum(counts) for _, counts in expected) > 10  # the oracle is accepted: a real comparison
    got = run(copy.deepcopy(cpu_model).to("cuda"), copy.deepcopy(draft).to("cuda"), graphs=True, compile=True)
    assert got == expected


@pytest.mark.parametrize("refill, capture_after", [("eager", 0), ("graphs", 0), ("graphs", 1), ("compiled", 0)])
def test_batch_decoder_on_cuda_equals_the_eager_cpu_decoder(refill, capture_after):
    """Flex attention in the captured step, rows refilled (eagerly, replaying a graph per bucket, its
    first forward eager where capture_after is 1, or compiled) while others decode, a conversation's
    next turn queued after its answer and resumed in its row (the CPU reference prefills it whole)."""
    prompts = PROMPTS + [[9, 8, 7, 6, 5, 4, 3, 2] * 9, [100, 200]]
    limits = [20, 3, 9, 5, 7]

    def serve(model, sessions=True, **kw):
        decoder = BatchDecoder(
            batch_runner(model, max_len=256, batch_size=3, **kw.pop("runner_kw", {})),
            sampling=Sampling(),
            chunk=4,
            **kw,
        )
        queue = [
            Request(p, n, key=("first", i), session=i if sessions else None)
            for i, (p, n) in enumerate(zip(prompts, limits))
        ]
        got = {}
        for request, completion in decoder.serve(lambda: queue.pop(0) if queue else None, [2]):
            got[request.key] = completion.tokens
            kind, i = request.key
            if kind == "first" and i < 2:
                queue.insert(
                    0,
                    Request(prompts[i] + completion.tokens + [42], 6, key=("next", i), session=i if sessions else None),
                )
        return got, decoder

    reference, _ = serve(
        peaked_model("llama"), sessions=False, graphs=False, compile=False, runner_kw={"attention": "sdpa"}
    )
    got, decoder = serve(on("cuda"), graphs=True, compile=True, refill=refill, refill_capture_after=capture_after)
    assert decoder.runner.attention == "flex"
    assert got == reference
    stats = decoder.stats()
    assert stats["decode_s"] > 0 and stats["refill_s"] > 0  # CUDA events, read after the syncs
    assert stats["resumed_tokens"] > 0


def test_the_captured_loop_check_ends_the_answers_the_cpu_check_ends():
    """--stop-loops on CUDA (the check a captured graph, refills graphed) cuts where the CPU's does."""
    model = cycling_model([[10, 11], [20, 21, 22], list(range(40, 100))])
    prompts = [[11, 10] * 6, [6, 20], [7, 40], [41] * 11 + [42]]

    def run(device, **kw):
        decoder = BatchDecoder(
            batch_runner(model.to(device), max_len=256, batch_size=3, **kw.pop("runner_kw", {})),
            sampling=Sampling(),
            chunk=4,
            stop_loops=8,
            **kw,
        )
        return [(c.tokens, c.finish_reason) for c in decoder.run(prompts, 40, [2])]

    reference = run("cpu", graphs=False, compile=False, runner_kw={"attention": "sdpa"})
    assert [reason for _, reason in reference] == ["loop", "loop", "length", "length"]
    assert run("cuda", graphs=True, compile=True, refill="graphs") == reference


def test_compiled_training_step_on_cuda_equals_the_eager_one():
    """`train --compile` on CUDA (inductor's Triton kernels, the merged attention's flash kernels
    eager between them): the loss, the stats and the gradients of the eager step, over batch shapes
    that share the four graphs; the target's compiled layers capture the eager aux states."""
    from eaglekit.targets.capture import capture_aux_states
    from eaglekit.train.loop import TTTModel, compile_target_layers, compiled_unrolled_loss, unrolled_loss
    from eaglekit.train.loss import step_counts
    from eaglekit.train.ttt import compile_guards
    from ttt_batch import batch_for, make_draft

    torch.manual_seed(0)
    draft = make_draft().cuda()
    steps = 4
    model = TTTModel(draft, steps, "merged")
    params = [p for p in draft.parameters() if p.requires_grad]
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[0.8**j for j in range(steps)])
    compiled = compiled_unrolled_loss()
    for T, B in [(11, 2), (9, 1), (13, 3)]:
        batch = batch_for(make_draft(), T=T, B=B)[0].to("cuda")  # the same seeded draft's vocab, on the CPU
        den = step_counts(batch.loss_mask, steps)
        a, b = compiled(model, batch, den, **kw), unrolled_loss(model, batch, den, **kw)
        torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.stats, b.stats, atol=1e-5, rtol=1e-5)
        for x, y in zip(torch.autograd.grad(a.loss, params), torch.autograd.grad(b.loss, params)):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    from tiny import tiny_model

    target = tiny_model("llama").eval().to("cuda")
    ids = torch.randint(3, 200, (3, 17), device="cuda")
    eager = capture_aux_states(target, ids, list(AUX))
    compile_target_layers(target)
    with compile_guards():
        got = capture_aux_states(target, ids, list(AUX))
    err = (got.aux_hidden - eager.aux_hidden).norm() / eager.aux_hidden.norm()  # reductions reordered: rounding only
    assert err < 1e-5, err


def test_target_cache_on_cuda_reads_back_what_the_target_gave():
    """`train --cache-target` on CUDA: page-locked arenas (cudaHostRegister), asynchronous copies both
    ways; a batch read back equals the one the target ran, its aux states and teacher exactly (bf16)."""
    from eaglekit.draft.vocab import DraftVocab
    from eaglekit.features.conversations import Sample
    from eaglekit.train.sources import OnlineSource
    from eaglekit.train.target_cache import attach_target_caches
    from tiny import tiny_model

    torch.manual_seed(0)
    target = tiny_model("llama").eval().to("cuda", torch.bfloat16)
    lengths = [17, 9, 23, 5]
    samples = [Sample(str(i), torch.randint(3, 200, (n,)), torch.arange(n) >= n // 3) for i, n in enumerate(lengths)]
    vocab = DraftVocab(draft_ids=torch.arange(2, 120), vocab_size=target.config.vocab_size)
    source = OnlineSource(target, samples, list(AUX), vocab)
    (cache,) = attach_target_caches([source, None], page_locked=True)
    assert cache.aux.is_pinned() and cache.last.is_pinned() and cache.tokens == sum(lengths)
    device = torch.device("cuda")
    ran = source.batch([2, 0, 1], device)
    read = source.batch([2, 0, 1], device)
    assert (cache.batches_target, cache.batches_cached) == (1, 1)
    real = torch.arange(ran.input_ids.shape[1], device="cuda") < ran.lengths[:, None]  # [B, T]
    assert torch.equal(read.aux[real], ran.aux[real])
    assert torch.equal(read.teacher.argmax[real], ran.teacher.argmax[real])
    assert torch.equal(read.teacher.probs[real], ran.teacher.probs[real])
    source.batch([3], device)  # another sample: the target runs for it, then it is held too
    assert cache.holds([0, 1, 2, 3]) and cache.batches_target == 2
