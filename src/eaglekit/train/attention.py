"""TTT attention: step j, position t attends to the step-0 keys 0..t (the true prefix, causal) and to
its own chain keys (steps 1..j at position t), never another position's chain. Two forms compute it:

- dense (`dense_ttt_attention`, `--ttt-attention dense`): the reference formula. It builds
  [B, nkv, g, L, L+j] scores and an fp32 softmax per step, and autograd keeps them for the backward:
  ~1.8 GB a step at B*L=16384, L=2048, 9 heads.
- merged (`merged_ttt_attention`, the default): the same without the [L, L] score matrix. The prefix
  goes through the fused causal kernel (flash on GPU, the CPU flash kernel on CPU), which returns its
  log-sum-exp lse_p; the j chain scores [B, nh, L, j] are tiny, so

    lse = logaddexp(lse_p, logsumexp(s_chain))
    out = exp(lse_p - lse) * out_prefix + sum_i exp(s_i - lse) * v_i

The backward reuses the kernel's own backward with the *merged* out and lse: its P = exp(S - lse)
are then the joint softmax weights of the prefix keys and its D = rowsum(dO * out) the joint one, so
it returns exactly the prefix part of the joint gradient (the ring-attention trick); the chain part
is a few [B, nh, L, j] einsums. Memory kept per step: q/k/v, out and lse, O(L * (hd + j)).

The kernels are PyTorch's private SDPA ops (there is no public SDPA that returns a differentiable
lse); `check_merged_attention` compares them with the dense form once, so a PyTorch whose ops
changed meaning is refused rather than trained on (and `--ttt-attention dense` still trains there).
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from eaglekit.errors import EaglekitError
from eaglekit.train.config import ATTENTIONS

aten = torch.ops.aten


# ---- the two forms, and the choice between them (`--ttt-attention`) -------------------------------


def dense_ttt_attention(
    q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag_k: list[torch.Tensor], diag_v: list[torch.Tensor]
) -> torch.Tensor:
    """Attention of TTT step j = len(diag_k), the reference formula: causal over the step-0 keys plus
    each position's own chain, from the step-0 scores with a causal mask plus j diagonal terms.

    Args:
        q: [B, nh, L, hd] queries of step j (rope applied at positions t+j).
        k0, v0: [B, nkv, L, hd] step-0 keys/values (the true prefix).
        diag_k, diag_v: j tensors [B, nkv, L, hd]: keys/values of steps 1..j at the same position.

    Returns:
        [B, nh, L, hd]; position t mixes v0[:t+1] and diag_v[i][t] only.
    """
    B, nh, L, hd = q.shape
    nkv = k0.shape[1]
    qg = q.view(B, nkv, nh // nkv, L, hd)  # GQA: query groups per kv head
    scale = hd**-0.5
    prefix = torch.matmul(qg, k0.unsqueeze(2).transpose(-1, -2)) * scale  # [B, nkv, g, L, L]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    prefix = prefix.masked_fill(~causal, float("-inf"))
    if diag_k:
        kd = torch.stack(diag_k, dim=-2)  # [B, nkv, L, j, hd]
        vd = torch.stack(diag_v, dim=-2)
        own = torch.einsum("bkgld,bkljd->bkglj", qg, kd) * scale  # [B, nkv, g, L, j]
        scores = torch.cat([prefix, own], dim=-1)  # [B, nkv, g, L, L+j]
    else:
        scores = prefix
    weights = scores.float().softmax(-1).to(v0.dtype)
    out = torch.matmul(weights[..., :L], v0.unsqueeze(2))  # [B, nkv, g, L, hd]
    if diag_k:
        out = out + torch.einsum("bkglj,bkljd->bkgld", weights[..., L:], vd)
    return out.reshape(B, nh, L, hd)


def ttt_attention(
    q: torch.Tensor,
    k0: torch.Tensor,
    v0: torch.Tensor,
    diag_k: list[torch.Tensor],
    diag_v: list[torch.Tensor],
    attention: str = "dense",
) -> torch.Tensor:
    """TTT attention of step j = len(diag_k) (see `dense_ttt_attention`); `attention` picks the implementation."""
    if attention == "merged":
        return merged_ttt_attention(q, k0, v0, diag_k, diag_v)
    if attention == "dense":
        return dense_ttt_attention(q, k0, v0, diag_k, diag_v)
    raise EaglekitError(f"unknown TTT attention {attention!r}", hint=f"use one of {ATTENTIONS}")


# ---- the causal prefix kernel, per device ---------------------------------------------------------


def prefix_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Causal attention q -> (k, v), all [B, nh, L, hd] (GQA already expanded).

    Returns (out [B, nh, L, hd], lse_raw, state): lse_raw is the kernel's own log-sum-exp tensor
    (its layout and padding are the kernel's; `lse_view` reads it as [B, nh, L]), state what its
    backward needs besides the tensors.
    """
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        return out, lse, ("cpu",)
    if q.dtype in (torch.float16, torch.bfloat16):
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale
        )
        return out, lse, ("flash", cum_q, cum_k, max_q, max_k, seed, offset)
    # fp32 on GPU: the memory-efficient kernel (flash is half precision only); its lse is padded to 32.
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True, scale=scale)
    return out, lse, ("efficient", seed, offset)


def lse_view(lse_raw: torch.Tensor, L: int) -> torch.Tensor:
    """The kernel's log-sum-exp as [B, nh, L] fp32 (drops the efficient kernel's padding)."""
    return lse_raw[..., :L].float()


def prefix_backward(grad_out, q, k, v, out, lse_raw, state, scale: float):
    """Gradients (dq, dk, dv) of the prefix kernel, given the (merged) out and lse in its layout."""
    kind = state[0]
    if kind == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse_raw, 0.0, True, scale=scale
        )
    if kind == "flash":
        _, cum_q, cum_k, max_q, max_k, seed, offset = state
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse_raw, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset, scale=scale
        )
    _, seed, offset = state
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse_raw, seed, offset, 0.0, [True, True, True, False], True, scale=scale
    )
    return dq, dk, dv


# ---- the merged attention -------------------------------------------------------------------------


def chain_scores(q: torch.Tensor, kd: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, nh, L, hd] x [B, nh, L, j, hd] -> [B, nh, L, j] fp32: each query against its own chain keys."""
    return torch.einsum("bhld,bhljd->bhlj", q.float(), kd.float()) * scale


class MergedTTTAttention(torch.autograd.Function):
    """Causal prefix (fused kernel) + own-chain keys, merged by log-sum-exp; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k0, v0, kd, vd):
        # q, k0, v0: [B, nh, L, hd]; kd, vd: [B, nh, L, j, hd] (j >= 1)
        with torch.autocast(q.device.type, enabled=False):  # the merge stays fp32 (autocast would cast einsum down)
            return MergedTTTAttention.merged_forward(ctx, q, k0, v0, kd, vd)

    @staticmethod
    def merged_forward(ctx, q, k0, v0, kd, vd):
        L, hd = q.shape[-2], q.shape[-1]
        scale = hd**-0.5
        out_p, lse_raw, state = prefix_forward(q, k0, v0, scale)
        lse_p = lse_view(lse_raw, L)  # [B, nh, L]
        s_chain = chain_scores(q, kd, scale)  # [B, nh, L, j]
        lse = torch.logaddexp(lse_p, s_chain.logsumexp(-1))  # joint normalizer
        p_chain = torch.exp(s_chain - lse.unsqueeze(-1))  # [B, nh, L, j]
        out = (
            torch.exp(lse_p - lse).unsqueeze(-1) * out_p.float() + torch.einsum("bhlj,bhljd->bhld", p_chain, vd.float())
        ).to(q.dtype)
        merged_raw = lse_raw.clone()  # the kernel's layout
        merged_raw[..., :L] = lse
        ctx.save_for_backward(q, k0, v0, kd, vd, out, merged_raw)
        ctx.state = state
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k0, v0, kd, vd, out, merged_raw = ctx.saved_tensors
        L, hd = q.shape[-2], q.shape[-1]
        scale = hd**-0.5
        grad_out = grad_out.to(out.dtype)
        dq, dk0, dv0 = prefix_backward(grad_out.contiguous(), q, k0, v0, out, merged_raw, ctx.state, scale)
        lse = lse_view(merged_raw, L)
        p_chain = torch.exp(chain_scores(q, kd, scale) - lse.unsqueeze(-1))  # [B, nh, L, j]
        g = grad_out.float()  # [B, nh, L, hd]
        delta = (g * out.float()).sum(-1, keepdim=True)  # rowsum(dO * O), joint
        ds = p_chain * (torch.einsum("bhld,bhljd->bhlj", g, vd.float()) - delta)
        dq = dq.float() + scale * torch.einsum("bhlj,bhljd->bhld", ds, kd.float())
        dkd = scale * ds.unsqueeze(-1) * q.float().unsqueeze(-2)  # [B, nh, L, j, hd]
        dvd = p_chain.unsqueeze(-1) * g.unsqueeze(-2)
        return dq.to(q.dtype), dk0, dv0, dkd.to(kd.dtype), dvd.to(vd.dtype)


@contextlib.contextmanager
def plan_free_attention():
    """SDPA without its cuDNN backend, for training.

    Packed batches change shape at every step, and cuDNN builds an execution plan on the host for
    each new shape: in a GPU profile (`train --profile-steps 400:420`) those host-side plans took much
    of a step's wall time, the device idle meanwhile (docs/notes/training.md, "What was tried
    for the training step"). Flash and memory-efficient kernels need no plan. The flags are
    process-wide, so the batch-prefetch thread follows them too.
    """
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, nkv, ...] -> [B, nkv * groups, ...] (GQA: kv head h serves query heads h*g .. h*g+g-1)."""
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def merged_ttt_attention(
    q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, diag_k: list[torch.Tensor], diag_v: list[torch.Tensor]
) -> torch.Tensor:
    """`dense_ttt_attention`'s result without its [L, L] scores (same arguments and shapes)."""
    groups = q.shape[1] // k0.shape[1]
    # The kernels want one dtype: autocast's, as SDPA under autocast would take. The rotated q/k are
    # fp32 there (RoPE's cos/sin are), and fp32 would send the prefix to the memory-efficient kernel
    # instead of flash (docs/notes/training.md, "flash for the prefix"). The merge stays fp32.
    dtype = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else q.dtype
    q = q.to(dtype)
    k0x, v0x = expand_kv(k0, groups).to(dtype), expand_kv(v0, groups).to(dtype)
    if not diag_k:  # step 0: plain causal
        return torch.nn.functional.scaled_dot_product_attention(q, k0x, v0x, is_causal=True)
    kd = expand_kv(torch.stack(diag_k, dim=-2), groups).to(dtype)  # [B, nh, L, j, hd]
    vd = expand_kv(torch.stack(diag_v, dim=-2), groups).to(dtype)
    return MergedTTTAttention.apply(q, k0x, v0x, kd, vd)


def check_merged_attention(device: torch.device, dtype: torch.dtype) -> None:
    """Compare the merged attention with the dense form on a small random case (forward and gradients).

    Raises:
        EaglekitError: the private SDPA ops are missing or compute something else in this PyTorch.
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    B, nh, nkv, L, hd, j = 2, 4, 2, 37, 64, 2

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_()

    q, k0, v0 = rand(B, nh, L, hd), rand(B, nkv, L, hd), rand(B, nkv, L, hd)
    dk, dv = [rand(B, nkv, L, hd) for _ in range(j)], [rand(B, nkv, L, hd) for _ in range(j)]
    inputs = [q, k0, v0, *dk, *dv]
    try:
        merged = merged_ttt_attention(q, k0, v0, dk, dv)
        grads = torch.autograd.grad(merged.float().square().sum(), inputs)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise EaglekitError(
            f"the merged TTT attention does not run in torch {torch.__version__} on {device}: {e}",
            hint="train with --ttt-attention dense",
        ) from e
    dense = dense_ttt_attention(q.float(), k0.float(), v0.float(), [x.float() for x in dk], [x.float() for x in dv])
    ref = torch.autograd.grad(dense.square().sum(), inputs)
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    worst = max(
        [(merged.float() - dense).abs().max().item()]
        + [
            ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1)).item()
            for a, b in zip(grads, ref)
        ]
    )
    if worst > tol:
        raise EaglekitError(
            f"the merged TTT attention differs from the dense one by {worst:.2e} in torch "
            f"{torch.__version__} on {device} ({dtype})",
            hint="train with --ttt-attention dense",
        )
