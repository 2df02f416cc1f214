"""eaglekit's native tensor names, every name a draft checkpoint writes them under, and the EAGLE-3.1
layout flags that add tensors (`read_layout`, `layout_tensors`).

Native names are SGLang's (docs/contracts.md): `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t`, `t2d`. The only rename any format needs is the decoder layer's prefix
(each format's `layer_prefix`): SGLang, EAGLE and SpecForge write `midlayer.*`; vLLM's speculators
format and ModelOpt (since 2026-03) write `layers.0.*` (docs/serving-formats.md §2). No torch here.
"""

from __future__ import annotations

NATIVE_LAYER = "midlayer."
# Names third-party checkpoints use for the decoder layer, tried in this order when importing.
LAYER_ALIASES = ("midlayer.", "layers.0.")
# A `model.` prefix: SGLang tolerates it, vLLM and TRT-LLM prepend their own and break.
MODEL_PREFIX = "model."
VOCAB_MAPS = ("d2t", "t2d")
# Every tensor of a native checkpoint (the draft's state dict without the target's embedding).
NATIVE_TENSORS = (
    "fc.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
)
EMBED = "embed_tokens.weight"  # the target's; some formats ship a copy


def layout_tensors(*, norm_before_fc: bool, fc_norm: bool, num_aux: int, **_) -> tuple[str, ...]:
    """The tensors an EAGLE-3.1 layout adds to `NATIVE_TENSORS`: one RMSNorm over the concatenated aux
    states (`norm_before_fc`) and/or one per aux state (`fc_norm`). SGLang's and vLLM's names. Takes a
    layout dict whole (`layout_tensors(**layout, num_aux=k)`): `norm_output` adds no tensor."""
    whole = ("input_norm.weight",) if norm_before_fc else ()
    return whole + (tuple(f"fc_norm.{i}.weight" for i in range(num_aux)) if fc_norm else ())


def read_layout(flat: dict, *, use_aux_norm: bool = True) -> dict[str, bool]:
    """EAGLE-3.1's flags as SGLang and vLLM read a flat config: `norm_before_fc` from `eagle_config`
    first, then top-level; `fc_norm` top-level (SGLang also takes its older name `use_aux_norm`, vLLM
    not: `use_aux_norm=False`); `norm_output` top-level. The one reader of them: detect, the
    engines' readings and the doctor agree."""
    eagle = flat.get("eagle_config") or {}
    return {
        "fc_norm": bool(flat.get("fc_norm") or (use_aux_norm and flat.get("use_aux_norm"))),
        "norm_before_fc": bool(eagle.get("norm_before_fc", flat.get("norm_before_fc", False))),
        "norm_output": bool(flat.get("norm_output", False)),
    }


def is_layout_tensor(name: str) -> bool:
    """Whether a native name is one `layout_tensors` can hold, whatever the config says."""
    return name == "input_norm.weight" or (name.startswith("fc_norm.") and name.endswith(".weight"))


def implied_layout(names) -> dict[str, bool]:
    """The norm flags native tensor names ask for (`layout_tensors` read backwards)."""
    return {
        "fc_norm": any(n.startswith("fc_norm.") and n.endswith(".weight") for n in names),
        "norm_before_fc": "input_norm.weight" in names,
    }


def native_name(name: str) -> tuple[str, str | None]:
    """Map one checkpoint name to its native name.

    Returns:
        (native name, the layer prefix it was written with or None). A name with an unknown layer
        prefix comes back unchanged; the caller decides whether the native model has it.
    """
    bare = name[len(MODEL_PREFIX) :] if name.startswith(MODEL_PREFIX) else name
    for alias in LAYER_ALIASES:
        if bare.startswith(alias):
            return NATIVE_LAYER + bare[len(alias) :], alias
    return bare, None


def layer_style(names) -> str | None:
    """Which layer prefix a set of names uses: "midlayer.", "layers.0.", "mixed" or None."""
    styles = {native_name(n)[1] for n in names} - {None}
    if len(styles) > 1:
        return "mixed"
    return styles.pop() if styles else None
