"""The cheaper training step computes what the plain one did: merged TTT attention vs the dense
formula, the fused soft CE vs log_softmax, in fp32 on tiny shapes (torch.compile vs eager:
tests/integration/test_train_speed.py)."""

import pytest
import torch

from eaglekit.features.teacher import Teacher
from eaglekit.train.attention import check_merged_attention, dense_ttt_attention, merged_ttt_attention
from eaglekit.train.loss import soft_cross_entropy, step_counts, ttt_loss
from eaglekit.train.ttt import ttt_unroll
from ttt_batch import batch_for, make_draft, plain_soft_ce, teachers

torch.set_num_threads(1)


def attention_inputs(B=2, nh=6, nkv=2, L=13, hd=16, j=3, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).float().requires_grad_()

    q, k0, v0 = rand(B, nh, L, hd), rand(B, nkv, L, hd), rand(B, nkv, L, hd)
    return q, k0, v0, [rand(B, nkv, L, hd) for _ in range(j)], [rand(B, nkv, L, hd) for _ in range(j)]


@pytest.mark.parametrize("j", [0, 1, 3])
@pytest.mark.parametrize("nkv", [1, 2, 6])
def test_merged_attention_equals_dense_forward_and_gradients(j, nkv):
    q, k0, v0, dk, dv = attention_inputs(nkv=nkv, j=j)
    inputs = [q, k0, v0, *dk, *dv]
    weight = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))  # a loss that weights every output
    new = merged_ttt_attention(q, k0, v0, dk, dv)
    old = dense_ttt_attention(q, k0, v0, dk, dv)
    torch.testing.assert_close(new, old, atol=1e-5, rtol=1e-5)
    new_grads = torch.autograd.grad((new * weight).sum(), inputs)
    old_grads = torch.autograd.grad((old * weight).sum(), inputs)
    for a, b in zip(new_grads, old_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_merged_attention_self_check_passes_on_cpu():
    check_merged_attention(torch.device("cpu"), torch.float32)
    check_merged_attention(torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("chunk_elements", [7, 2**27])  # many small position chunks, one chunk
def test_fused_soft_ce_equals_log_softmax_formula(kind, chunk_elements):
    B, L, V = 2, 9, 31
    full = teachers(B, L + 2, V)[kind]  # strided views of its positions 1..L
    teacher = Teacher(
        full.argmax[:, 1 : 1 + L], full.probs[:, 1 : 1 + L], None if full.index is None else full.index[:, 1 : 1 + L]
    )
    logits_full = (torch.randn(B, L + 3, V, generator=torch.Generator().manual_seed(1)) * 3).requires_grad_()
    logits = logits_full[:, :L]
    weight = torch.rand(B, L, generator=torch.Generator().manual_seed(2))
    new = soft_cross_entropy(logits, teacher, soft_ce="fused", chunk_elements=chunk_elements)
    old = plain_soft_ce(logits, teacher)
    unfused = soft_cross_entropy(logits, teacher)
    torch.testing.assert_close(new, old, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(unfused, old, atol=1e-5, rtol=1e-5)
    (g_new,) = torch.autograd.grad((new * weight).sum(), logits_full)
    (g_old,) = torch.autograd.grad((old * weight).sum(), logits_full)
    torch.testing.assert_close(g_new, g_old, atol=1e-6, rtol=1e-5)


def test_fused_soft_ce_keeps_bf16_logits_and_matches_fp32():
    B, L, V = 2, 5, 40
    teacher = teachers(B, L, V)["dense"]
    logits = (torch.randn(B, L, V, generator=torch.Generator().manual_seed(3)) * 3).bfloat16().requires_grad_()
    new = soft_cross_entropy(logits, teacher, soft_ce="fused")
    old = plain_soft_ce(logits, teacher)
    assert new.dtype == torch.float32
    torch.testing.assert_close(new, old, atol=1e-5, rtol=1e-5)  # same bf16 inputs, both fp32 inside
    (g,) = torch.autograd.grad(new.sum(), logits)
    assert g.dtype == torch.bfloat16


def unrolled_loss(draft, batch, steps, **kw):
    attention = kw.pop("attention", "merged")
    kw.setdefault("soft_ce", "fused" if attention == "merged" else "plain")
    logits = ttt_unroll(draft, batch.aux, batch.input_ids, steps, attention)
    return ttt_loss(
        logits,
        batch,
        draft.d2t,
        draft.t2d,
        weights=[0.8**j for j in range(steps)],
        denominators=step_counts(batch.loss_mask, steps),
        **kw,
    )


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_new_step_equals_old_step_loss_stats_and_gradients(kind):
    """merged attention + fused CE vs dense attention + the plain CE: one training step's numbers."""
    draft = make_draft()
    batch, _ = batch_for(draft, T=11, teacher_kind=kind, k=8)
    steps = 4
    params = [p for p in draft.parameters() if p.requires_grad]
    new = unrolled_loss(draft, batch, steps)
    new_grads = torch.autograd.grad(new.loss, params)
    old = unrolled_loss(draft, batch, steps, attention="dense")
    old_grads = torch.autograd.grad(old.loss, params)
    torch.testing.assert_close(new.loss, old.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new.stats, old.stats, atol=1e-4, rtol=1e-5)
    for a, b in zip(new_grads, old_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_compiled_steps_share_four_graphs_over_every_step_and_shape():
    """`compiled_steps`: every TTT step and batches of other sizes, one row included (given an empty
    second row), run the same four graphs, and give the eager loss and stats (an int step index or a
    specialized size would compile one per step or per batch)."""
    from torch._dynamo.utils import counters

    from eaglekit.train.loop import TTTModel, compiled_unrolled_loss, unrolled_loss

    torch._dynamo.reset()
    counters.clear()
    draft = make_draft()
    steps = 4
    model = TTTModel(draft, steps, "merged")
    compiled = compiled_unrolled_loss("eager")  # dynamo's graphs, no AOT or codegen: fast
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[0.8**j for j in range(steps)])
    for T, B in [(11, 2), (9, 1), (13, 3)]:
        batch, _ = batch_for(draft, T=T, B=B)
        den = step_counts(batch.loss_mask, steps)
        out = compiled(model, batch, den, **kw)
        ref = unrolled_loss(model, batch, den, **kw)
        torch.testing.assert_close(out.loss, ref.loss)
        torch.testing.assert_close(out.stats, ref.stats)
        out.loss.backward()
    assert counters["stats"]["unique_graphs"] == 4
    assert not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_compiled_target_layers_share_one_graph_and_capture_the_same_states(arch):
    """Online --compile: the target's decoder layers compiled one by one share one graph over every
    layer and batch shape, and the aux states and logits are the eager ones (the capture hooks run)."""
    from torch._dynamo.utils import counters

    from eaglekit.targets.capture import capture_aux_states
    from eaglekit.train.loop import compile_target_layers
    from eaglekit.train.ttt import compile_guards
    from tiny import tiny_model

    torch._dynamo.reset()
    counters.clear()
    model = tiny_model(arch).eval()
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 200, shape, generator=g) for shape in ((2, 11), (3, 17), (4, 9))]
    eager = [capture_aux_states(model, ids, [1, 3]) for ids in rows]
    compile_target_layers(model, backend="eager")
    with compile_guards():
        compiled = [capture_aux_states(model, ids, [1, 3]) for ids in rows]
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a.aux_hidden, b.aux_hidden)
        torch.testing.assert_close(a.logits, b.logits)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_compile_refuses_ddp_and_unknown_attention(tmp_path):
    from eaglekit.errors import EaglekitError
    from eaglekit.train.config import TrainConfig
    from eaglekit.train.loop import check_compile_supported

    with pytest.raises(EaglekitError, match="DDP"):
        check_compile_supported(torch.device("cpu"), world_size=2)
    with pytest.raises(EaglekitError, match="TTT attention"):
        TrainConfig(target="x", data="x", out=str(tmp_path), ttt_attention="flash")


def test_bench_train_step_smoke_runs_every_eager_variant(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_train_step.py"
    spec = importlib.util.spec_from_file_location("bench_train_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--smoke", "--variants", "merged,new", "--out", str(tmp_path)])
    assert [r["variant"] for r in results] == ["merged", "new"]
    assert all(r["ms_per_step"] > 0 and r["loss_matches_first"] for r in results)
    assert (tmp_path / "bench_train_step.json").is_file()


def test_bench_train_step_smoke_mixed_shapes_and_online_target(tmp_path):
    """--mix: varied packed shapes taken in turn; --target: the real (tiny) target's forward timed apart."""
    import importlib.util
    from pathlib import Path

    from tiny import save_tiny_target

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "bench_train_step.py"
    spec = importlib.util.spec_from_file_location("bench_train_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--smoke", "--mix", "3", "--variants", "merged,new"])
    assert [r["shapes"] for r in results] == [3, 3] and all(r["loss_matches_first"] for r in results)
    target = save_tiny_target(tmp_path / "target")
    results = module.main(["--smoke", "--mix", "3", "--variants", "merged,new", "--target", str(target)])
    assert all(r["target_ms"] > 0 and r["draft_ms"] > 0 and r["loss_matches_first"] for r in results)


def test_merged_attention_runs_its_kernels_in_the_autocast_dtype():
    """Under autocast the rotated q/k arrive in fp32 (RoPE's cos/sin are); the prefix kernel must get
    autocast's dtype as SDPA would (flash, not fp32's memory-efficient kernel on a GPU)."""
    g = torch.Generator().manual_seed(0)
    B, nh, nkv, L, hd = 2, 4, 2, 13, 16
    q, k0, v0 = (torch.randn(B, h, L, hd, generator=g) for h in (nh, nkv, nkv))
    dk = [torch.randn(B, nkv, L, hd, generator=g) for _ in range(2)]
    dv = [torch.randn(B, nkv, L, hd, generator=g) for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = merged_ttt_attention(q, k0, v0, dk, dv)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), dense_ttt_attention(q, k0, v0, dk, dv), atol=3e-2, rtol=3e-2)
    assert merged_ttt_attention(q, k0, v0, dk, dv).dtype == torch.float32  # no autocast: the inputs' dtype


def test_soft_ce_choices_are_checked(tmp_path):
    from eaglekit.errors import EaglekitError
    from eaglekit.train.config import TrainConfig

    with pytest.raises(EaglekitError, match="unknown soft CE"):
        soft_cross_entropy(torch.zeros(1, 2, 3), teachers(1, 2, 3)["dense"], soft_ce="triton")
    with pytest.raises(EaglekitError, match="--compile runs the plain soft CE"):
        TrainConfig(target="x", data="x", out=str(tmp_path), compile=True, soft_ce="compiled")
