"""Target runners (FAST and GENERIC) give the HF model's logits, with the engine's own cache:
prefill, decode one token at a time, a tree forward with a custom mask, and compaction."""

import pytest
import torch

from eaglekit.engine.tree import tree_from_parents
from eaglekit.errors import EaglekitError
from eaglekit.runtime.kv import cache_mask, causal_block
from eaglekit.runtime.runner import make_target_runner
from eaglekit.runtime.target_fast import FastTarget, fast_unsupported_reason
from engine_tiny import AUX, one_thread, peaked_model  # noqa: F401 (fixture)
from tiny import ARCHITECTURES

FAST_ARCHS = ("llama", "qwen2", "qwen3", "mistral")
L = 48


def close(got, ref):
    """Equal up to float32 reordering, relative to the logits' scale (peaked models: large logits)."""
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=5e-5 * float(ref.detach().abs().max()))


def ids(n, seed=0):
    return torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(seed))


def run_prefix_then_decode(runner, x, split):
    """Prefill x[:, :split], then decode the rest one token at a time -> logits [1, T, V]."""
    pos = torch.arange(split)
    logits, aux = runner(x[:, :split], pos[None], pos, cache_mask(causal_block(split), 0, 0, L))
    out = [logits]
    for t in range(split, x.shape[1]):
        step, _ = runner(x[:, t : t + 1], torch.tensor([[t]]), torch.tensor([t]), cache_mask(causal_block(1), t, t, L))
        out.append(step)
    return torch.cat(out, 1), aux


KERNELS = {
    "fast": {},
    "fast:sdpa": dict(attention="sdpa", matvec=False),
    "fast:matmul": dict(attention="matmul"),
    "generic": {},
}


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_runner_matches_hf_forward(arch, kind):
    """Every kernel choice of the fast runner (attention kind; one-token linears as reductions or
    cuBLAS) is the same math. The default at batch 1 is reduce attention with matvec linears."""
    kernels = KERNELS[kind]
    kind = kind.partition(":")[0]
    if kind == "fast" and arch not in FAST_ARCHS:
        pytest.skip("not a Llama-family decoder")
    model = peaked_model(arch)
    runner = make_target_runner(model, max_len=L, aux_layer_ids=AUX, runner=kind, **kernels)
    assert runner.kind == kind
    x = ids(12)
    ref = model(input_ids=x, output_hidden_states=True)
    got, aux = run_prefix_then_decode(runner, x, 8)
    close(got, ref.logits)
    H = model.config.hidden_size
    for slot, layer in enumerate(AUX):
        close(aux[0, :, slot * H : (slot + 1) * H], ref.hidden_states[layer + 1][0, :8])


@pytest.mark.parametrize(
    "arch,attention", [("llama", None), ("qwen3", None), ("mixtral", None), ("llama", "sdpa"), ("llama", "matmul")]
)
def test_tree_forward_and_compaction_match_a_fresh_forward(arch, attention):
    """Tree tokens at depth positions see only their ancestors; after compacting the accepted path
    the cache continues exactly like a fresh forward of the whole committed prefix."""
    model = peaked_model(arch)
    runner = make_target_runner(model, max_len=L, aux_layer_ids=AUX, attention=attention)
    prefix = ids(6, seed=1)[0]
    P = len(prefix)
    runner(prefix[None], torch.arange(P)[None], torch.arange(P), cache_mask(causal_block(P), 0, 0, L))
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 4])
    tokens = torch.tensor([11, 12, 13, 14, 15, 16, 17])
    tree = tree_from_parents(tokens, parents, 3)
    slots = P + torch.arange(7)
    logits, _ = runner(tokens[None], (P + tree.depth)[None], slots, cache_mask(tree.anc, P, P, L))
    for node in range(7):  # each node's logits = a plain forward of prefix + its root path
        path = torch.nonzero(tree.anc[node]).flatten()
        ref = model(input_ids=torch.cat([prefix, tokens[path]])[None]).logits[0, -1]
        close(logits[0, node], ref)
    accepted = torch.tensor([0, 1, 4, 6])  # root -> 1 -> 4 -> 6
    runner.move_kv(P + accepted, P + torch.arange(4))
    n = P + 4
    nxt = torch.tensor([[99]])
    got, _ = runner(nxt, torch.tensor([[n]]), torch.tensor([n]), cache_mask(causal_block(1), n, n, L))
    ref = model(input_ids=torch.cat([prefix, tokens[accepted], nxt[0]])[None]).logits[0, -1]
    close(got[0, 0], ref)


@pytest.mark.parametrize("attention", ["sdpa", "matmul", "reduce"])
def test_batch_rows_with_left_padding_match_single_rows(attention):
    from eaglekit.data.batch_decoder import padded_mask

    model = peaked_model("qwen2")
    runner = make_target_runner(model, max_len=L, batch_size=2, attention=attention)
    a, b = ids(5, 3)[0], ids(3, 4)[0]
    x = torch.stack([a, torch.cat([torch.zeros(2, dtype=torch.long), b])])
    pad = torch.tensor([0, 2])
    slots = torch.arange(5)
    logits, _ = runner(x, (slots[None] - pad[:, None]).clamp(min=0), slots, padded_mask(pad, slots, L))
    close(logits[0], model(input_ids=a[None]).logits[0])
    close(logits[1, 2:], model(input_ids=b[None]).logits[0])


def test_auto_picks_fast_for_llama_and_generic_otherwise():
    assert make_target_runner(peaked_model("llama"), max_len=L).kind == "fast"
    assert make_target_runner(peaked_model("gemma"), max_len=L).kind == "generic"
    assert "model_type 'phi3'" in fast_unsupported_reason(peaked_model("phi3"), L)


def test_fast_refuses_unsupported_config_and_a_logit_mismatch(monkeypatch):
    with pytest.raises(EaglekitError, match="does not support"):
        make_target_runner(peaked_model("mixtral"), max_len=L, runner="fast")
    # Gemma's names look like Llama's but its math differs (norm 1 + w, scaled embeddings, gelu):
    # force past the up-front decision and the check at load must refuse it.
    import eaglekit.runtime.target_fast as fast

    monkeypatch.setattr(fast, "fast_unsupported_reason", lambda model, max_len: None)
    with pytest.raises(EaglekitError, match="differ from the HF model"):
        FastTarget(peaked_model("gemma"), max_len=L)


def test_unknown_attention_kind_and_attention_on_the_generic_runner_are_refused():
    with pytest.raises(EaglekitError, match="unknown attention kind"):
        make_target_runner(peaked_model("llama"), max_len=L, attention="flash9")
    with pytest.raises(EaglekitError, match="fast runner only"):
        make_target_runner(peaked_model("gemma"), max_len=L, attention="matmul")
    with pytest.raises(EaglekitError, match="fast runner only"):
        make_target_runner(peaked_model("gemma"), max_len=L, matvec=True)


def test_sliding_window_shorter_than_the_cache_is_refused():
    model = peaked_model("mistral", seed=7)  # a model of its own: its config is changed
    model.config.sliding_window = 16
    with pytest.raises(EaglekitError, match="sliding"):
        make_target_runner(model, max_len=L, runner="generic")
    assert make_target_runner(model, max_len=16).kind == "fast"


def test_kernel_forms_compute_the_same_math():
    """The forms `attend` and `linear` pick inside torch.compile (reduce attention, matvec linears, the
    output projection by heads) equal the eager ones, with a ragged mask (rows that see different slots)."""
    from eaglekit.runtime.kernels import matvec_linear, matvec_swiglu, output_projection, project_by_heads
    from eaglekit.runtime.kv import attend_matmul, attend_reduce, attend_sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((1, 2, 6, 8), (1, 2, 10, 8), (1, 2, 10, 8)))
    mask = torch.rand(1, 1, 6, 10, generator=g) > 0.4
    mask[..., 0] = True  # no empty row
    ref = attend_sdpa(q, k, v, mask)
    torch.testing.assert_close(attend_matmul(q, k, v, mask), ref)
    torch.testing.assert_close(attend_reduce(q, k, v, mask), ref)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    for shape in ((1, 1, 16), (1, 6, 16), (2, 3, 16), (5, 16)):  # one row, and rows unrolled
        x = torch.randn(shape, generator=g)
        torch.testing.assert_close(matvec_linear(x, w, b), torch.nn.functional.linear(x, w, b))
        torch.testing.assert_close(matvec_linear(x, w, None), torch.nn.functional.linear(x, w))
        gate, up = torch.nn.functional.linear(x, w, b).chunk(2, dim=-1)
        torch.testing.assert_close(matvec_swiglu(x, w, b), torch.nn.functional.silu(gate) * up)
    out = attend_sdpa(q, k, v, mask)[0]  # [heads 2, T 6, d 8] -> [6, 24] through w [24, 2 * 8]
    for bias in (b, None):
        flat = torch.nn.functional.linear(out.transpose(0, 1).reshape(6, 16), w, bias)
        torch.testing.assert_close(output_projection(out, w, bias), flat)
    assert not project_by_heads(1, 64)  # eager: the usual transpose and F.linear


def test_matvec_forms_fuse_at_most_sixteen_rows():
    """Above MATVEC_MAX_ROWS Inductor splits the unrolled rows into many kernels: refused, not slow."""
    from eaglekit.engine import DraftRunner, SpecConfig
    from eaglekit.runtime import Sampling
    from eaglekit.runtime.kernels import MATVEC_MAX_ROWS
    from engine_tiny import random_draft

    model = peaked_model("llama")
    assert make_target_runner(model, max_len=L, small_rows=MATVEC_MAX_ROWS).small_rows == MATVEC_MAX_ROWS
    for bad in (0, MATVEC_MAX_ROWS + 1):
        with pytest.raises(EaglekitError, match="small_rows"):
            make_target_runner(model, max_len=L, small_rows=bad)
        with pytest.raises(EaglekitError, match="small_rows"):
            DraftRunner(
                random_draft(model), spec=SpecConfig(mode="chain", k=3), sampling=Sampling(), max_len=L, small_rows=bad
            )


def test_few_rows_linear_is_f_linear():
    """The eager CPU form for a few rows (`weight @ x.T`, one row padded to two) is F.linear's math,
    and `linear` is F.linear's math whichever form this CPU timed faster."""
    from eaglekit.runtime.kernels import CPU_FEW_ROWS, few_rows_linear, linear

    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(40, 16, generator=g), torch.randn(40, generator=g)
    for shape in ((1, 1, 16), (1, 4, 16), (3, 16), (2, 5, 16)):
        x = torch.randn(shape, generator=g)
        for bias in (b, None):
            ref = torch.nn.functional.linear(x, w, bias)
            torch.testing.assert_close(few_rows_linear(x, w, bias), ref)
            torch.testing.assert_close(linear(x, w, bias), ref)
    big = torch.randn(CPU_FEW_ROWS + 1, 16, generator=g)
    torch.testing.assert_close(linear(big, w, b), torch.nn.functional.linear(big, w, b))


def test_the_cpu_few_rows_form_is_measured_once_and_followed(monkeypatch):
    """`linear` takes `few_rows_linear` for one row / a few rows exactly where the process's timing
    said it is faster (it is machine-dependent: 2x faster on one host, 2.5x slower on another)."""
    from eaglekit.runtime import kernels

    choice = kernels.cpu_few_rows_faster()
    assert choice == kernels.cpu_few_rows_faster() and all(isinstance(c, bool) for c in choice)
    taken = []
    monkeypatch.setattr(kernels, "few_rows_linear", lambda x, w, b: taken.append(x.shape[0]) or x @ w.T)
    w = torch.randn(8, 16)
    for picks in ((True, False), (False, True), (False, False)):
        monkeypatch.setattr(kernels, "cpu_few_rows_faster", lambda picks=picks: picks)
        taken.clear()
        for rows in (1, 3, kernels.CPU_FEW_ROWS + 1):
            kernels.linear(torch.randn(rows, 16), w)
        assert taken == [rows for rows, pick in ((1, picks[0]), (3, picks[1])) if pick]


def test_compiled_default_kernels_decode_like_eager():
    """Inside torch.compile the batch-1 defaults switch to reduce attention and matvec linears;
    compiled on CPU (Inductor's C++ backend) the greedy tokens equal the eager run's."""
    from eaglekit.engine import Engine

    model = peaked_model("qwen2")  # attention biases: matvec's bias path
    prompt = ids(6, seed=5)[0].tolist()
    eager = Engine(make_target_runner(model, max_len=L), compile=False).generate(prompt, 10, speculative=False)
    runner = make_target_runner(model, max_len=L)
    assert (runner.attention, runner.matvec) == ("reduce", True)
    compiled = Engine(runner, compile=True).generate(prompt, 10, speculative=False)
    assert compiled.tokens == eager.tokens


def test_default_kernels_follow_what_was_measured():
    from eaglekit.runtime.kernels import default_kernels

    assert default_kernels(1, 270 * 2**20) == ("reduce", True)  # SmolLM2: launch-bound
    assert default_kernels(1, 16 * 2**30) == ("sdpa", False)  # 8B: bandwidth-bound
    assert default_kernels(64, 270 * 2**20) == ("sdpa", False)  # batched generation
    runner = make_target_runner(peaked_model("llama"), max_len=L, batch_size=2)
    assert (runner.attention, runner.matvec) == ("sdpa", False)
