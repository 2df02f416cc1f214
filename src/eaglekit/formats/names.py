"""The one rename table between eaglekit's native tensor names and every format's names.

Native names are SGLang's (docs/contracts.md): `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t`, `t2d`. The only rename any format needs is the decoder layer's prefix:
SGLang, EAGLE and SpecForge write `midlayer.*`; vLLM's speculators format and ModelOpt (since
2026-03) write `layers.0.*` (docs/serving-formats.md §2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: the export options read this module, and --help stays without torch
    import torch

NATIVE_LAYER = "midlayer."

# format -> (the layer prefix it writes, whether d2t/t2d are written when draft vocab == target vocab)
# EAGLE deletes its d2t/t2d buffers and vLLM has no draft_id_to_target_id parameter when the
# vocabularies are equal (vLLM then refuses a `d2t` tensor), so those formats leave them out.
FORMATS: dict[str, tuple[str, bool]] = {
    "sglang": ("midlayer.", True),
    "vllm": ("layers.0.", False),
    "eagle": ("midlayer.", True),
}
# Names third-party checkpoints use for the decoder layer, tried in this order when importing.
LAYER_ALIASES = ("midlayer.", "layers.0.")
# A `model.` prefix: SGLang tolerates it, vLLM and TRT-LLM prepend their own and break.
MODEL_PREFIX = "model."
VOCAB_MAPS = ("d2t", "t2d")
# Every tensor of a native checkpoint (the draft's state dict without the target's embedding).
NATIVE_TENSORS = (
    "fc.weight",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    "norm.weight", "lm_head.weight", "d2t", "t2d",
)
EMBED = "embed_tokens.weight"  # the target's; some formats ship a copy


def check_format(fmt: str) -> str:
    from eaglekit.errors import EaglekitError

    if fmt not in FORMATS:
        raise EaglekitError(f"unknown format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    return fmt


def to_format(native: dict[str, torch.Tensor], fmt: str, *, same_vocab: bool) -> dict[str, torch.Tensor]:
    """Rename native tensors to a format's names (and drop the vocab maps where the format has none)."""
    layer, keep_maps = FORMATS[check_format(fmt)]
    out = {}
    for name, tensor in native.items():
        if name in VOCAB_MAPS and same_vocab and not keep_maps:
            continue
        out[layer + name[len(NATIVE_LAYER):] if name.startswith(NATIVE_LAYER) else name] = tensor
    return out


def native_name(name: str) -> tuple[str, str | None]:
    """Map one checkpoint name to its native name.

    Returns:
        (native name, the layer prefix it was written with or None). A name with an unknown layer
        prefix comes back unchanged; the caller decides whether the native model has it.
    """
    bare = name[len(MODEL_PREFIX):] if name.startswith(MODEL_PREFIX) else name
    for alias in LAYER_ALIASES:
        if bare.startswith(alias):
            return NATIVE_LAYER + bare[len(alias):], alias
    return bare, None


def layer_style(names) -> str | None:
    """Which layer prefix a set of names uses: "midlayer.", "layers.0.", "mixed" or None."""
    styles = {native_name(n)[1] for n in names} - {None}
    if len(styles) > 1:
        return "mixed"
    return styles.pop() if styles else None
