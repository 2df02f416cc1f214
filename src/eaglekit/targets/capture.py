"""Generic aux-state capture: forward hooks on the target's decoder layers.

The decoder-layer list is found from the module tree (the `ModuleList` with one entry per
`num_hidden_layers`), never from the architecture name, so any `AutoModelForCausalLM` works:
dense, MoE, MLA. Aux ids are eaglekit's convention: the output of 0-based decoder layer i, i.e. the
residual stream before the final norm, which is `output_hidden_states[i + 1]`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from eaglekit.errors import EaglekitError
from eaglekit.targets.info import check_aux_layer_ids
from eaglekit.targets.load import text_config

SKIP_TOWERS = ("vision", "visual", "audio", "image", "mtp")


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """Return the target's list of decoder layers, found by structure.

    Raises:
        EaglekitError: no `ModuleList` of `num_hidden_layers` entries exists.
    """
    num_layers = text_config(model.config).num_hidden_layers
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) == num_layers
        and not any(word in name.lower() for word in SKIP_TOWERS)
    ]
    if not found:
        raise EaglekitError(
            f"found no list of {num_layers} decoder layers in {type(model).__name__}",
            hint="the target's decoder layers must be an nn.ModuleList of num_hidden_layers entries",
        )
    # The shallowest match is the decoder stack (a nested list of the same length would be deeper).
    found.sort(key=lambda item: item[0].count("."))
    return found[0][1]


@dataclass
class AuxCapture:
    """What one target forward gives the draft and its loss.

    aux_hidden:  [B, T, len(aux_layer_ids) * H] concatenated aux states, in id order
    last_hidden: [B, T, H] the target's final hidden state after its final norm
    logits:      [B, T, V] the target's logits, or None when not asked for
    """

    aux_hidden: torch.Tensor
    last_hidden: torch.Tensor
    logits: torch.Tensor | None


@contextmanager
def aux_hooks(model: nn.Module, aux_layer_ids: list[int]):
    """Register forward hooks on the aux layers; yield the dict they fill (layer id -> [B, T, H])."""
    layers = decoder_layers(model)
    ids = check_aux_layer_ids(aux_layer_ids, len(layers))
    states: dict[int, torch.Tensor] = {}

    def hook_for(layer_id: int):
        def hook(_module, _args, output):
            states[layer_id] = output[0] if isinstance(output, (tuple, list)) else output

        return hook

    handles = [layers[i].register_forward_hook(hook_for(i)) for i in ids]
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()


def concat_aux(states: dict[int, torch.Tensor], aux_layer_ids: list[int], hidden_size: int) -> torch.Tensor:
    """Concatenate captured states in id order, checking every width."""
    parts = []
    for i in aux_layer_ids:
        if i not in states:
            raise EaglekitError(
                f"decoder layer {i} did not run (no aux state captured)", hint="is the layer skipped for these inputs?"
            )
        if states[i].shape[-1] != hidden_size:
            raise EaglekitError(
                f"aux state of layer {i} is {states[i].shape[-1]} wide, expected the target hidden size {hidden_size}",
                hint="report this architecture",
            )
        # A target sharded over devices (device_map) leaves each layer's state on its own device.
        parts.append(states[i].to(parts[0].device) if parts else states[i])
    return torch.cat(parts, dim=-1)  # [B, T, k*H]


def causal_mask_suffices(attention_mask: torch.Tensor) -> bool:
    """True when every row's padding is on its right ([B, T] 1 then 0): causal attention already keeps
    it from every real token. Without the mask SDPA runs its causal flash kernel instead of the masked
    memory-efficient one, which computed every block of [T, T] for each of the target's layers (a
    share of an online training step worth saving: docs/notes/training.md, "flash for the prefix").
    One host sync."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


@torch.no_grad()
def capture_aux_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    aux_layer_ids: list[int],
    *,
    attention_mask: torch.Tensor | None = None,
    return_logits: bool = True,
) -> AuxCapture:
    """Run the target once and return its aux states, final hidden state and (optionally) logits.

    Args:
        model: any `AutoModelForCausalLM`.
        input_ids: [B, T] token ids.
        aux_layer_ids: ids in eaglekit's convention (output of 0-based layer i).
        attention_mask: [B, T] 1 for real tokens, 0 for padding. Padding only on the right is
            dropped (`causal_mask_suffices`): the padding positions' own outputs then differ, the
            real tokens' do not.
        return_logits: False skips the LM head (saves [B, T, V] memory during feature capture).
    """
    if attention_mask is not None and causal_mask_suffices(attention_mask):
        attention_mask = None
    hidden_size = text_config(model.config).hidden_size
    decoder = model.get_decoder()
    final: dict[str, torch.Tensor] = {}

    def keep_last(_module, _args, output):
        final["h"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    with aux_hooks(model, aux_layer_ids) as states:
        if return_logits:
            handle = decoder.register_forward_hook(keep_last)
            try:
                logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
            finally:
                handle.remove()
        else:
            keep_last(None, None, decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False))
            logits = None
        aux = concat_aux(states, aux_layer_ids, hidden_size)
    return AuxCapture(aux_hidden=aux, last_hidden=final["h"], logits=logits)


def check_fused_width(width: int, *, num_aux: int, target_hidden: int, what: str = "fused aux input") -> None:
    """The draft's `fc` must see len(aux_layer_ids) * target_hidden features, never one layer's state."""
    expected = num_aux * target_hidden
    if width != expected:
        raise EaglekitError(
            f"{what} is {width} wide, expected {num_aux} aux layers x {target_hidden} = {expected}",
            hint="the aux states of all layers must be concatenated (a single-layer state means capture is off)",
        )
