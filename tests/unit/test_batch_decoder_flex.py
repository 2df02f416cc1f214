"""FlexAttention over the boolean mask's own blocks (runtime.flex) computes the dense attention:
compiled on CPU here (the block lists, the whole blocks read without the mask, the skipped ones);
eagerly it is SDPA, so a runner built with it decodes as the default one does."""

import pytest
import torch
import torch.nn.functional as F

from eaglekit.data.batch_decoder import BatchDecoder, batch_runner
from eaglekit.runtime import Sampling, make_target_runner
from eaglekit.runtime.flex import BLOCK, attend_flex, block_mask_of
from engine_tiny import PROMPTS, one_thread, peaked_model  # noqa: F401 (fixture)


def masks(B: int, R: int, L: int) -> torch.Tensor:
    """Rows ending on and beside block edges, an empty tail, and a scattered (tree-like) pattern."""
    ends = torch.tensor([0, BLOCK - 1, BLOCK, L - 1])[:B]
    mask = torch.arange(L).view(1, 1, 1, L) <= ends.view(B, 1, 1, 1)
    mask = mask.expand(B, 1, R, L).clone()
    gen = torch.Generator().manual_seed(0)
    mask[-1, 0, 1:] &= torch.rand(R - 1, L, generator=gen) < 0.3  # other queries see a scatter
    mask[-1, 0, :, 0] = True  # no empty softmax row
    return mask


def test_block_lists_follow_the_mask():
    L = 3 * BLOCK
    bm = block_mask_of(masks(4, 2, L))
    kv, full = bm.kv_num_blocks.view(4).tolist(), bm.full_kv_num_blocks.view(4).tolist()
    assert kv == [1, 0, 1, 3] and full == [0, 1, 1, 0]  # partial / whole blocks of each row
    assert bm.full_kv_indices[2, 0, 0, 0] == 0 and bm.kv_indices[2, 0, 0, 0] == 1


@pytest.mark.parametrize("rows", [4, 1])  # per-row masks, and one mask for every row
def test_compiled_flex_equals_dense_attention(rows):
    B, h, R, L, d = 4, 2, 3, 3 * BLOCK, 16
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, h, n, d, generator=gen) for n in (R, L, L))
    mask = masks(4, R, L)[:rows].contiguous()
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(attend_flex(q, k, v, mask), ref)  # eager: SDPA itself
    torch._dynamo.reset()
    got = torch.compile(attend_flex, dynamic=False)(q, k, v, mask)
    assert (got - ref).abs().max() < 1e-5


def test_flex_runner_decodes_like_the_default_one():
    model = peaked_model("llama")
    flex = batch_runner(model, max_len=100, batch_size=2, attention="flex")
    assert flex.attention == "flex" and flex.max_len == BLOCK  # slots rounded up to a block
    dense = make_target_runner(model, max_len=BLOCK, batch_size=2)
    got = [
        BatchDecoder(r, sampling=Sampling(), graphs=False, compile=False).run(PROMPTS, 12, []) for r in (flex, dense)
    ]
    assert [c.tokens for c in got[0]] == [c.tokens for c in got[1]]


def test_decode_step_traces_whole_with_flex(monkeypatch):
    """Dynamo and AOT autograd trace the batch decode step in one graph with flex attention (the block
    mask built from the in-graph mask), and it decodes as eager does; only Inductor's CUDA kernels are
    left to the GPU (its CPU template takes no in-graph buffers in a mask)."""
    from eaglekit.data.batch_decoder import Request
    from eaglekit.runtime.graphs import Step

    model = peaked_model("llama")
    limits = [20, 6, 12]
    eager = BatchDecoder(
        batch_runner(model, max_len=BLOCK, batch_size=2, attention="flex"),
        sampling=Sampling(),
        graphs=False,
        compile=False,
        chunk=4,
    )
    queue = iter([Request(p, n, key=i) for i, (p, n) in enumerate(zip(PROMPTS, limits))])
    ref = {r.key: c.tokens for r, c in eager.serve(lambda: next(queue, None), [])}
    traced = BatchDecoder(
        batch_runner(model, max_len=BLOCK, batch_size=2, attention="flex"),
        sampling=Sampling(),
        graphs=False,
        compile=False,
        chunk=4,
    )
    import eaglekit.runtime.flex as flex

    built = {}  # one value set again and again: no recompiles

    def counted(mask):
        built["rows"] = mask.shape[0]
        return block_mask_of(mask)

    monkeypatch.setattr(flex, "block_mask_of", counted)
    torch._dynamo.reset()
    traced.step = Step(
        torch.compile(traced._step, backend="aot_eager", fullgraph=True, dynamic=False), use_graph=False, name="traced"
    )
    queue = iter([Request(p, n, key=i) for i, (p, n) in enumerate(zip(PROMPTS, limits))])
    assert {r.key: c.tokens for r, c in traced.serve(lambda: next(queue, None), [])} == ref
    assert built == {"rows": 2}  # the traced step took the flex path


def test_compiled_batch_decoder_with_flex_builds_the_block_mask_once_a_step(monkeypatch):
    """compile=True compiles each layer (Inductor's CPU flex kernel here): the block mask is built once
    a step, outside the layers, and passed to each; the tokens are eager's, from one graph."""
    from torch._dynamo.utils import counters

    import eaglekit.runtime.flex as flex
    from eaglekit.data.batch_decoder import Request

    model = peaked_model("llama")
    limits = [20, 6, 12]
    runs, built = {}, []
    monkeypatch.setattr(flex, "block_mask_of", lambda mask: built.append(mask.shape) or block_mask_of(mask))
    for compile in (False, True):
        torch._dynamo.reset()
        counters.clear()
        decoder = BatchDecoder(
            batch_runner(model, max_len=BLOCK, batch_size=2, attention="flex"),
            sampling=Sampling(),
            graphs=False,
            compile=compile,
            chunk=4,
        )
        queue = iter([Request(p, n, key=i) for i, (p, n) in enumerate(zip(PROMPTS, limits))])
        runs[compile] = {r.key: c.tokens for r, c in decoder.serve(lambda q=queue: next(q, None), [])}
    assert runs[True] == runs[False]
    assert counters["stats"]["unique_graphs"] == 1
    assert len(built) == decoder.steps and decoder.steps > 0  # eager: none (SDPA); compiled: one a step
