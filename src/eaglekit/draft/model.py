"""The EAGLE-3 draft model, top to bottom, with the SGLang parameter names.

    fc:        [3*Ht] -> [H]          fuses the target's low/mid/high aux states; EAGLE-3.1 normalizes
               them first (`fc_norm.{i}` one RMSNorm per state, or `input_norm` one over all three)
    midlayer:  one Llama decoder layer whose q/k/v read cat(input_layernorm(embed(token)),
               hidden_norm(h)) (width 2H); o_proj back to H; SwiGLU MLP
    norm, lm_head: [H] -> [draft_vocab_size]; draft id d is target id d + d2t[d]
    carried:   what the next draft step reads as its hidden state: the layer's pre-norm output,
               or with `norm_output` (EAGLE-3.1) the normed one
    embed_tokens: the target's embedding, frozen, never saved with the draft

The attention itself is left to the caller (`attention_pieces` / `finish`), because training
(the TTT mask over a prefix plus each position's own draft chain) and decoding (a KV cache) need
different attention; `forward` is the plain causal version for tests and simple callers. The
pieces take the `linear` they project with (F.linear by default): the engine passes kernels made
for its few-row steps, training keeps F.linear.

Shapes: B batch, T tokens, H hidden, Ht target hidden, k number of aux layers,
nh/nkv query/key heads, hd head dim, Vd draft vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eaglekit.draft.config import DraftConfig
from eaglekit.targets.capture import check_fused_width


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        width = 2 * cfg.hidden_size  # cat(embedding, hidden)
        self.q_proj = nn.Linear(width, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)


class DraftMLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[-x2, x1] for x = [x1, x2] (the last dim's halves), as a roll and a sign: under torch.compile
    both fuse into the rope's kernel, where torch.cat((-x2, x1)) wrote each half in a kernel of its
    own (four more launches a layer for q and k: scripts/gpu/kernel_counts.py). The same values (a
    negation is exact). The target runners' rope too (`runtime.target_fast`)."""
    half = x.shape[-1] // 2
    rolled = x.roll(half, dims=-1)  # [x2, x1]
    return torch.where(torch.arange(x.shape[-1], device=x.device) < half, -rolled, rolled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, heads, T, hd]; cos/sin: [B, T, hd]
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class Eagle3Draft(nn.Module):
    """An EAGLE-3 draft. Parameter names are the SGLang names (docs/contracts.md)."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = config
        H = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, H)
        self.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
        self.fc = nn.Linear(config.fused_width, H, bias=False)
        if config.norm_before_fc:
            self.input_norm = RMSNorm(config.fused_width, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(config.target_hidden_size, config.rms_norm_eps) for _ in range(config.num_aux)
            )
        self.midlayer = DraftLayer(config)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config.llama_config())
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    # ---- pieces -------------------------------------------------------------------------------

    def fuse(self, aux_hidden: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """[B, T, k*Ht] concatenated target aux states -> [B, T, H]."""
        check_fused_width(
            aux_hidden.shape[-1], num_aux=self.config.num_aux, target_hidden=self.config.target_hidden_size
        )
        x = aux_hidden.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            x = self.input_norm(x)
        if self.config.fc_norm:
            x = torch.cat([norm(part) for norm, part in zip(self.fc_norm, x.chunk(self.config.num_aux, -1))], -1)
        return linear(x, self.fc.weight)

    def rope(self, position_ids: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(like, position_ids)  # cos, sin: [B, T, hd]

    def attention_pieces(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        linear=F.linear,
        wqkv: torch.Tensor | None = None,
    ):
        """Project one draft step's inputs to rotated q/k/v.

        Args:
            input_ids: [B, T] target token ids (embedded with the frozen target embedding).
            hidden: [B, T, H] fused target features (step 0) or the draft's own previous output.
            position_ids: [B, T].
            wqkv: q/k/v's weights concatenated (`fused_weights`): one matmul for the three (inference).

        Returns:
            q [B, nh, T, hd], k [B, nkv, T, hd], v [B, nkv, T, hd], residual [B, T, H].
        """
        cfg, layer = self.config, self.midlayer
        B, T = input_ids.shape
        embeds = self.embed_tokens(input_ids).to(hidden.dtype)  # [B, T, H]
        normed = layer.hidden_norm(hidden)
        residual = normed if cfg.norm_before_residual else hidden
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        attn = layer.self_attn
        if wqkv is None:
            q, k, v = (linear(x, proj.weight) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        else:
            q, k, v = linear(x, wqkv).split([m.out_features for m in (attn.q_proj, attn.k_proj, attn.v_proj)], -1)
        q = q.view(B, T, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = k.view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = v.view(B, T, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = self.rope(position_ids, x)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, residual

    def finish(
        self,
        attn_out: torch.Tensor,
        residual: torch.Tensor,
        linear=F.linear,
        w13: torch.Tensor | None = None,
        by_heads=None,
    ) -> torch.Tensor:
        """[B, nh, T, hd] attention output + [B, T, H] residual -> [B, T, H] the carried state: the layer's
        pre-norm output, normed with `norm_output`. `logits` takes it either way.
        w13: gate and up weights concatenated (`fused_weights`): one matmul for the two (inference).
        by_heads: the output projection as (out [nh, T, hd], weight) -> [T, H] for B = 1
        (`runtime.kernels.output_projection`, inference); None: the heads side by side, then `linear`."""
        B, _, T, _ = attn_out.shape
        layer, mlp = self.midlayer, self.midlayer.mlp
        wo = layer.self_attn.o_proj.weight
        if by_heads is not None and B == 1:
            h = residual + by_heads(attn_out[0], wo)
        else:
            h = residual + linear(attn_out.transpose(1, 2).reshape(B, T, -1), wo)
        x = layer.post_attention_layernorm(h)
        if w13 is None:
            gate, up = linear(x, mlp.gate_proj.weight), linear(x, mlp.up_proj.weight)
        else:
            gate, up = linear(x, w13).chunk(2, dim=-1)
        out = h + linear(F.silu(gate) * up, mlp.down_proj.weight)
        return self.norm(out) if self.config.norm_output else out

    def fused_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(wqkv [nh*hd + 2*nkv*hd, 2H], w13 [2*I, H]) for inference, where one matmul for q/k/v and
        one for gate/up are fewer launches than five. Concatenated copies, made once per draft (the
        runners of a bench sweep share them) and made again when a weight has changed since."""
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        parts = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in parts)
        if getattr(self, "_fused_key", None) != key:
            with torch.no_grad():
                self._fused = (torch.cat(parts[:3]), torch.cat(parts[3:]))
            self._fused_key = key
        return self._fused

    def logits(self, hidden_out: torch.Tensor, linear=F.linear) -> torch.Tensor:
        """[B, T, H] carried state (`finish`) -> [B, T, Vd] draft-vocab logits."""
        normed = hidden_out if self.config.norm_output else self.norm(hidden_out)
        return linear(normed, self.lm_head.weight)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocab ids to target ids: target = draft + d2t[draft]."""
        return draft_ids + self.d2t[draft_ids]

    # ---- plain causal forward ----------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """One draft step over T new tokens with causal attention to `past_kv` and themselves.

        Args:
            input_ids: [B, T].
            hidden: [B, T, H]: `fuse(aux_hidden)` for target features, or the draft's own output.
            position_ids: [B, T]; default continues after `past_kv`.
            past_kv: (k, v) [B, nkv, P, hd] from earlier calls, or None.

        Returns:
            logits [B, T, Vd], hidden_out [B, T, H], (k, v) including the new tokens.
        """
        B, T = input_ids.shape
        P = 0 if past_kv is None else past_kv[0].shape[2]
        if position_ids is None:
            position_ids = torch.arange(P, P + T, device=input_ids.device).expand(B, T)
        q, k, v, residual = self.attention_pieces(input_ids, hidden, position_ids)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        mask = torch.ones(T, P + T, dtype=torch.bool, device=q.device).tril(diagonal=P)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        hidden_out = self.finish(out, residual)
        return self.logits(hidden_out), hidden_out, (k, v)

    # ---- weights ------------------------------------------------------------------------------

    def draft_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors a draft checkpoint holds (SGLang names), without the target's embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed_tokens.", "rotary."))}

    def set_target_embedding(self, weight: torch.Tensor) -> None:
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            from eaglekit.errors import EaglekitError

            raise EaglekitError(
                f"target embedding is {tuple(weight.shape)}, the draft expects {tuple(self.embed_tokens.weight.shape)}",
                hint="is this the draft's target?",
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight)
