"""FAST target runner: a lean dense decoder built from an HF Llama-family model's own weights.

One file, gpt-fast style: the math of Llama / Mistral / Qwen2 / Qwen3 parameterized by the HF
config (GQA, rope tables from the model's own rotary module, optional qk-norm, attention and MLP
biases, tied embeddings, rms eps). q/k/v and gate/up are fused into one matmul each. Whether a
model is supported is decided up front (`fast_unsupported_reason`); once built, the runner's logits
are checked against the HF model's and a mismatch raises instead of falling back.

Shapes: B batch, T tokens, H hidden, nh/nkv query/kv heads, d head dim, L cache slots, V vocab,
A aux width (len(aux_layer_ids) * H).
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.draft.model import rotate_half  # one rope for the draft and the target runners
from eaglekit.errors import EaglekitError
from eaglekit.runtime.flex import flex_mask
from eaglekit.runtime.graphs import compiled
from eaglekit.runtime.kernels import (
    SMALL_ROWS,
    check_small_rows,
    default_kernels,
    kernel_for_rows,
    linear,
    matvec_swiglu,
    output_projection,
    project_by_heads,
)
from eaglekit.runtime.kv import (
    ATTENTION_KINDS,
    KVCache,
    Refill,
    attend,
    cache_mask,
    causal_block,
    group_mask,
    move_slots,
)
from eaglekit.targets.capture import decoder_layers
from eaglekit.targets.info import check_aux_layer_ids
from eaglekit.targets.load import text_config

log = logging.getLogger(__name__)

# Families whose decoder is exactly Llama's math (pre-norm, rope, SwiGLU, RMSNorm w * x).
FAST_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope tables that do not depend on length


def sliding_window(cfg) -> int | None:
    """The attention window if any layer uses one, else None."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if window and (types is None or "sliding_attention" in types):
        return int(window)
    return None


def fast_unsupported_reason(model, max_len: int) -> str | None:
    """Why the FAST runner cannot run this model, or None if it can (decided from the config)."""
    cfg = text_config(model.config)
    if cfg.model_type not in FAST_FAMILIES:
        return f"model_type {cfg.model_type!r} is not a plain Llama-family decoder {FAST_FAMILIES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (the lean decoder implements SwiGLU with silu)"
    window = sliding_window(cfg)
    if window is not None and window < max_len:
        return f"sliding-window attention ({window} < {max_len} cache slots)"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"rope_type {rope!r} depends on the sequence length"
    layer = decoder_layers(model)[0]
    for name in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ):
        try:
            layer.get_submodule(name)
        except AttributeError:
            return f"decoder layer has no {name}"
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalize in float32, cast back, then scale."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def fused(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases, zeros where missing) of linears sharing an input."""
    weight = frozen(torch.cat([m.weight for m in linears]))
    if all(m.bias is None for m in linears):
        return weight, None
    return weight, frozen(
        torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])
    )


def frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach(), requires_grad=False)


class FastLayer(nn.Module):
    def __init__(
        self, layer: nn.Module, cfg, cache: KVCache, attention: str, matvec: bool, small_rows: int, attention_rows: int
    ):
        super().__init__()
        self.attention, self.matvec, self.small_rows, self.attention_rows = (
            attention,
            matvec,
            small_rows,
            attention_rows,
        )
        attn, mlp = layer.self_attn, layer.mlp
        self.nh, self.nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.nh
        self.eps = cfg.rms_norm_eps
        self.wqkv, self.bqkv = fused(attn.q_proj, attn.k_proj, attn.v_proj)
        self.wo, self.bo = attn.o_proj.weight, attn.o_proj.bias
        self.w13, self.b13 = fused(mlp.gate_proj, mlp.up_proj)
        self.w2, self.b2 = mlp.down_proj.weight, mlp.down_proj.bias
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.q_norm = q_norm.weight if q_norm is not None else None
        self.k_norm = k_norm.weight if k_norm is not None else None
        self.cache = cache

    def forward(self, x, cos, sin, slots, mask):
        """x [B, T, H]; cos/sin [B, 1, T, d]; slots [T]; mask [B|1, 1, g*T, L] (grouped) -> [B, T, H]."""
        B, T, _ = x.shape
        rows = self.small_rows if self.matvec and B * T <= self.small_rows else 0  # linear(): 0 = F.linear
        qkv = linear(rms_norm(x, self.ln1, self.eps), self.wqkv, self.bqkv, rows)
        q, k, v = qkv.split([self.nh * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q, k, v = q.view(B, T, self.nh, self.d), k.view(B, T, self.nkv, self.d), v.view(B, T, self.nkv, self.d)
        if self.q_norm is not None:  # Qwen3: RMSNorm per head before rope
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_all, v_all = self.cache.write(slots, k, v)
        # A refill's prompts attend to themselves ([R, 1, T, T]) or to their rows' first C slots: no
        # cache blocks to skip, so flex (which wants L a multiple of its block) has nothing to gain there.
        kind = "sdpa" if isinstance(slots, Refill) else kernel_for_rows(self.attention, T, self.attention_rows)
        out = attend(q, k_all, v_all, mask, kind)  # [B, heads, T, d]
        if B == 1 and not rows and project_by_heads(T, self.d):  # a compiled verify (matvec steps fuse their own)
            x = x + output_projection(out[0], self.wo, self.bo)
        else:
            x = x + linear(out.transpose(1, 2).reshape(B, T, self.nh * self.d), self.wo, self.bo, rows)
        h = rms_norm(x, self.ln2, self.eps)
        if rows and torch.compiler.is_compiling():
            act = matvec_swiglu(h, self.w13, self.b13)
        else:
            gate, up = linear(h, self.w13, self.b13).chunk(2, dim=-1)
            act = F.silu(gate) * up
        return x + linear(act, self.w2, self.b2, rows)


class FastTarget(nn.Module):
    """The lean decoder with its own static KV cache.

    `forward(input_ids, positions, slots, mask)` writes the new tokens' keys/values at `slots` and
    returns logits [B, T, V] and aux states [B, T, A] (outputs of the aux layers, concatenated).
    `attention` (`kv.ATTENTION_KINDS`) and `matvec` (`linear`) pick kernels for the same math;
    None takes what was measured fastest for the shape (`default_kernels`). `small_rows`: the most
    tokens per forward that use the matvec and reduce forms (a chain's verify, not a 60-node tree's);
    `attention_rows` (None = `small_rows`) raises it for the reduce attention alone, whose few rows
    read the layer's cache from L2 where matvec linears re-read the weights for every row.
    """

    kind = "fast"

    def __init__(
        self,
        model: nn.Module,
        *,
        max_len: int,
        batch_size: int = 1,
        aux_layer_ids=(),
        check: bool = True,
        attention: str | None = None,
        matvec: bool | None = None,
        small_rows: int = SMALL_ROWS,
        attention_rows: int | None = None,
    ):
        super().__init__()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        default_attention, default_matvec = default_kernels(batch_size, weight_bytes)
        attention = attention or default_attention
        matvec = default_matvec if matvec is None else matvec
        if attention not in ATTENTION_KINDS:
            raise EaglekitError(f"unknown attention kind {attention!r}", hint=f"use one of {tuple(ATTENTION_KINDS)}")
        reason = fast_unsupported_reason(model, max_len)
        if reason:
            raise EaglekitError(
                f"the fast runner does not support this target: {reason}",
                hint="use the generic runner (--runner generic)",
            )
        cfg = text_config(model.config)
        layers = decoder_layers(model)
        self.aux_layer_ids = check_aux_layer_ids(list(aux_layer_ids), len(layers)) if aux_layer_ids else []
        self.max_len, self.batch_size = max_len, batch_size
        self.eps = cfg.rms_norm_eps
        self.hidden_size, self.vocab_size = cfg.hidden_size, model.get_output_embeddings().weight.shape[0]
        p = next(model.parameters())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        caches = [
            KVCache(batch_size, cfg.num_key_value_heads, max_len, head_dim, dtype=p.dtype, device=p.device)
            for _ in layers
        ]  # [B, h, L, d] each
        self.attention, self.matvec, self.small_rows = attention, matvec, check_small_rows(small_rows)
        self.attention_rows = small_rows if attention_rows is None else attention_rows
        self.layers = nn.ModuleList(
            FastLayer(layer, cfg, cache, attention, matvec, small_rows, self.attention_rows)
            for layer, cache in zip(layers, caches)
        )
        self.layer_calls: list | None = None  # inside `using`: the layers' compiled forms
        self.compiled_forms: dict[tuple[str, bool], list] = {}
        decoder = model.get_decoder()
        self.embed = model.get_input_embeddings().weight
        self.norm = decoder.norm.weight
        self.lm_head = model.get_output_embeddings().weight
        self.lm_bias = model.get_output_embeddings().bias
        cos, sin = decoder.rotary_emb(self.norm, torch.arange(max_len, device=p.device)[None])
        self.register_buffer("cos", cos[0], persistent=False)  # [L, d], model dtype like HF
        self.register_buffer("sin", sin[0], persistent=False)
        self.register_buffer(
            "move_index", torch.zeros(2 * max_len, dtype=torch.long, device=p.device), persistent=False
        )  # [2L] move_kv's src then dst slots
        if check:
            check_against_hf(self, model)

    @property
    def aux_width(self) -> int:
        return len(self.aux_layer_ids) * self.hidden_size

    @torch.no_grad()  # inference only; the layers' caches are written in place
    def forward(self, input_ids, positions, slots, mask, last_only: bool = False):
        """input_ids/positions [B, T], slots [T], mask [B|1, 1, T, L] bool -> logits [B, T, V], aux [B, T, A].

        With `last_only` the logits are computed for the last token only ([B, 1, V]).
        """
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [B, 1, T, d]
        mask = group_mask(mask, self.layers[0].nh // self.layers[0].nkv)
        compiled_layers = self.layer_calls is not None or torch.compiler.is_compiling()
        if self.attention == "flex" and compiled_layers and not isinstance(slots, Refill):
            mask = flex_mask(mask)  # its block lists once, not once per layer
        states = {}
        for i, layer in enumerate(self.layer_calls or self.layers):
            x = layer(x, cos, sin, slots, mask)
            if i in self.aux_layer_ids:
                states[i] = x
        aux = torch.cat([states[i] for i in self.aux_layer_ids], -1) if states else None
        if last_only:
            x = x[:, -1:]
        logits = linear(rms_norm(x, self.norm, self.eps), self.lm_head, self.lm_bias)
        return logits, aux

    def compiled_layers(self, mode: str, dynamic: bool = False) -> list:
        """The decoder layers under torch.compile ("regional" compilation), made once per (mode, dynamic).
        Every layer runs one compiled graph (dynamo takes a layer's weights and cache as inputs), so
        Inductor lowers one layer where compiling a whole step lowers them all: a third of the compile
        time (docs/notes/engine.md; docs/results/2026-12-04-cpu-regional-compile). `dynamic`: graphs for forwards of any
        rows and tokens but 0 and 1 (refills'), static: one per shape (a decode step's). Run them with `using`."""
        if (mode, dynamic) not in self.compiled_forms:
            self.compiled_forms[mode, dynamic] = [compiled(layer, True, mode, dynamic) for layer in self.layers]
        return self.compiled_forms[mode, dynamic]

    @contextlib.contextmanager
    def using(self, calls: list):
        """Forwards inside run these layer calls (`compiled_layers`); outside, the layers as they are."""
        before, self.layer_calls = self.layer_calls, calls
        try:
            yield
        finally:
            self.layer_calls = before

    def move_kv(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """cache[dst] = cache[src] in every layer's cache, src/dst [S].

        Each layer has its own cache: when they were views of one store and this moved the store, a
        graph writing both made Inductor copy every layer's cache out and back around each K/V write.
        The slots go through `move_index` first: with a scatter index computed in the graph (the
        engine's n + rows) Inductor wrote each layer's move as a kernel of its own; read from a buffer
        they fuse into a few (docs/notes/engine.md, "Launches counted without a GPU")."""
        S = src.shape[0]
        self.move_index[: 2 * S].copy_(torch.cat([src, dst]))
        src, dst = self.move_index[:S], self.move_index[S : 2 * S]
        for layer in self.layers:
            move_slots(layer.cache.k, src, dst)
            move_slots(layer.cache.v, src, dst)


@torch.no_grad()
def check_against_hf(runner, model, length: int = 8) -> None:
    """Raise if the runner's logits differ from the HF model's on a fixed short sequence."""
    device = runner.embed.device
    T = min(length, runner.max_len)
    ids = torch.arange(T, device=device).mul(7919).remainder(runner.vocab_size).view(1, T)
    ids = ids.expand(runner.batch_size, T)
    pos = torch.arange(T, device=device).expand(runner.batch_size, T)
    mask = cache_mask(causal_block(T, device), 0, 0, runner.max_len)
    got, _ = runner(ids, pos, torch.arange(T, device=device), mask)
    ref = model(input_ids=ids, use_cache=False).logits
    err = ((got.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-6)).item()
    tol = (
        1e-4 if got.dtype == torch.float32 else 1e-1
    )  # bf16 rounding compounds over 30+ random layers; a structural error gives ~1
    if not err <= tol:
        raise EaglekitError(
            f"the fast runner's logits differ from the HF model's (relative error {err:.2e} > {tol:.0e})",
            hint="this architecture's math is not plain Llama; use --runner generic and report it",
        )
