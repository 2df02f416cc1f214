"""GENERIC target runner: the HF model itself, with a KV cache the engine controls.

transformers' `StaticCache` writes at its own counter and ignores the positions it is given, so
rejected draft tokens could not be rolled back. `EngineCache` is a `transformers.Cache` whose layers
write at the slots the engine sets before each forward; the engine passes explicit position ids
and a ready 4-D mask (which HF models use as is), and aux states come from the forward hooks of
`target/capture.py`. No per-model code: any `AutoModelForCausalLM` whose attention calls
`past_key_values.update(k, v, layer_idx)` works (dense, MoE, MLA).

Shapes: B batch, T tokens, L cache slots, V vocab, A aux width.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin

from eaglekit.errors import EaglekitError
from eaglekit.runtime.kv import move_slots, write_slots
from eaglekit.runtime.target_fast import sliding_window
from eaglekit.targets.capture import aux_hooks, concat_aux, decoder_layers
from eaglekit.targets.info import check_aux_layer_ids
from eaglekit.targets.load import text_config


class EngineCacheLayer(CacheLayerMixin):
    """One layer's keys/values, [B, heads, L, dim] each, allocated on first write."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: "EngineCache"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, heads = self.owner.rows or key_states.shape[0], key_states.shape[1]  # a Refill writes fewer rows
        L = self.owner.max_len
        self.keys = key_states.new_zeros(B, heads, L, key_states.shape[-1])
        self.values = value_states.new_zeros(B, value_states.shape[1], L, value_states.shape[-1])
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.slots  # [T], [B, T] or a kv.Refill
        return write_slots(self.keys, slots, key_states), write_slots(self.values, slots, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_len, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.max_len

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        if self.is_initialized:
            move_slots(self.keys, src, dst)
            move_slots(self.values, src, dst)


class EngineCache(Cache):
    """A cache whose write slots the engine sets (`slots`) before every forward."""

    def __init__(self, num_layers: int, max_len: int, batch_size: int | None = None):
        self.max_len, self.rows = max_len, batch_size  # rows: not `batch_size`, a property of Cache
        self.slots: torch.Tensor | None = None  # [T] / [B, T] / kv.Refill: where this forward's tokens go
        self.length = 0  # informational; masks decide what is visible
        super().__init__(layers=[EngineCacheLayer(self) for _ in range(num_layers)])


class HFTarget(nn.Module):
    """The HF model behind the runner interface: `forward(input_ids, positions, slots, mask)`."""

    kind = "generic"

    def __init__(self, model: nn.Module, *, max_len: int, batch_size: int = 1, aux_layer_ids=()):
        super().__init__()
        cfg = text_config(model.config)
        window = sliding_window(cfg)
        if window is not None and window < max_len:
            raise EaglekitError(
                f"the target uses sliding-window attention ({window} tokens) and the engine's cache holds "
                f"{max_len}; the engine's masks are full attention",
                hint=f"use --cache-slots <= {window}",
            )
        self.model = model
        num_layers = len(decoder_layers(model))
        self.aux_layer_ids = check_aux_layer_ids(list(aux_layer_ids), num_layers) if aux_layer_ids else []
        self.max_len, self.batch_size = max_len, batch_size
        self.hidden_size, self.vocab_size = cfg.hidden_size, model.get_output_embeddings().weight.shape[0]
        self.cache = EngineCache(num_layers, max_len, batch_size)
        self.dtype = next(model.parameters()).dtype
        # Hooks stay for the runner's life (hook registration cannot sit inside a compiled step);
        # `close()` removes them.
        self._hooks = ExitStack()
        self._states = self._hooks.enter_context(aux_hooks(model, self.aux_layer_ids)) if self.aux_layer_ids else {}

    def close(self) -> None:
        """Remove the aux hooks from the HF model."""
        self._hooks.close()

    @property
    def aux_width(self) -> int:
        return len(self.aux_layer_ids) * self.hidden_size

    def forward(self, input_ids, positions, slots, mask, last_only: bool = False):
        """input_ids/positions [B, T], slots [T], mask [B|1, 1, T, L] bool -> logits [B, T, V], aux [B, T, A].

        With `last_only` the logits are computed for the last token only ([B, 1, V]).
        """
        self.cache.slots = slots
        # An additive mask works with every attention implementation (eager adds it, sdpa takes it).
        bias = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device)
        bias = bias.masked_fill(~mask, torch.finfo(self.dtype).min)
        kwargs = dict(
            input_ids=input_ids,
            position_ids=positions,
            use_cache=True,
            past_key_values=self.cache,
            attention_mask=bias.expand(input_ids.shape[0], 1, *mask.shape[2:]),
            logits_to_keep=1 if last_only else 0,
        )
        logits = self.model(**kwargs).logits
        if not self.aux_layer_ids:
            return logits, None
        return logits, concat_aux(self._states, self.aux_layer_ids, self.hidden_size)

    def move_kv(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for layer in self.cache.layers:
            layer.move(src, dst)
