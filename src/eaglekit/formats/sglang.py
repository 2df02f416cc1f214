"""SGLang's format (also SpecForge's and ModelOpt's): the native checkpoint cast for serving.

Names are the native ones (`midlayer.*`); the config is the flat Llama-style one SGLang reads
(`LlamaForCausalLMEagle3`, `draft_vocab_size`), with the aux ids nested in `eagle_config` as the
outputs of layer k, the numbers eaglekit uses (docs/serving-formats.md §1, §4). The reader models
SGLang's `llama_eagle3.py` and `model_runner.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.formats.base import (
    DEFAULTS,
    EngineReading,
    Format,
    defaults,
    eaglekit_block,
    layer_param,
    missing,
)
from eaglekit.formats.names import (
    EMBED,
    MODEL_PREFIX,
    NATIVE_LAYER,
    NATIVE_TENSORS,
    VOCAB_MAPS,
    layout_tensors,
    native_name,
    read_layout,
)

if TYPE_CHECKING:  # annotations only
    from eaglekit.draft.config import DraftConfig
    from eaglekit.formats.detect import Interpretation

ARCHITECTURE = "LlamaForCausalLMEagle3"

# Which SGLang versions drop a decoder-layer tensor named `layers.0.*`, read in each wheel's
# `models/llama_eagle3.py`: up to 0.5.11 the layer is `self.midlayer` and `load_weights` skips every
# name it does not find; from 0.5.12 the layer is `self.layers[0]` and `load_weights` maps the legacy
# `midlayer` to `layers.0`, so both names load (tests/interop/test_interop_loaders.py loads `layers.0.*`
# through 0.5.23's own loader). Any other unknown name is dropped by every version read.
LAYERS0 = "layers.0."
LAYERS0_DROPPED = "SGLang 0.5.11 and older"
LAYERS0_LOADED = "SGLang 0.5.12 and later load them (as midlayer.*)"
ALL_VERSIONS = "every SGLang version read (0.5.11, 0.5.12, 0.5.23)"


def recognises(config: dict) -> bool:
    archs = config.get("architectures") or []
    return "eagle_config" in config or any("Eagle3" in a for a in archs)


def aux_field_ids(flat: dict) -> list | None:
    return (flat.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")


def write_config(
    cfg: DraftConfig, *, facts=None, speculative_tokens: int | None = None, extra: dict | None = None
) -> dict:
    """SGLang's config: the native one (already in SGLang's names and convention)."""
    d = cfg.to_hf_dict()
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = SGLANG.engine_ids(cfg.aux_layer_ids)
    d["num_aux_hidden_states"] = cfg.num_aux  # newer SGLang sizes fc by it (sglang PR #24663)
    d["eaglekit"] = eaglekit_block(cfg, "sglang", extra)
    return d


def drops(dropped: list[str]) -> list[str]:
    """The names finding for SGLang, split by the versions each part applies to."""
    layer0 = [n for n in dropped if native_name(n)[1] == LAYERS0 and native_name(n)[0] in NATIVE_TENSORS]
    other = [n for n in dropped if n not in layer0]
    parts = []
    if layer0:
        parts.append(
            f"{LAYERS0_DROPPED} silently drop {len(layer0)} tensors ({', '.join(layer0[:4])}); {LAYERS0_LOADED}"
        )
    if other:
        parts.append(f"{ALL_VERSIONS} silently drops {len(other)} tensors ({', '.join(other[:4])})")
    return parts


def missing_where(dropped: list[str]) -> str:
    """The versions that leave missing parameters at init: the old ones, unless a name every version
    drops was dropped."""
    return f" in {LAYERS0_DROPPED}" if all(native_name(n)[1] == LAYERS0 for n in dropped) else ""


def engine_reading(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = interp.flat
    r = EngineReading("sglang", config=flat, draft_vocab_size=flat.get("draft_vocab_size"))
    if interp.format == "vllm":
        r.problems.append(
            (
                "fail",
                "SGLang does not read the speculators layout (transformer_layer_config)",
                "export with `eaglekit export --format sglang`",
            )
        )
    archs = flat.get("architectures") or []
    if ARCHITECTURE not in archs:
        r.problems.append(
            (
                "warn",
                f"architectures {archs} instead of {ARCHITECTURE}: SGLang versions differ in how they map other names",
                f"declare {ARCHITECTURE}",
            )
        )
    if flat.get("tie_word_embeddings"):
        r.problems.append(
            (
                "fail",
                "tie_word_embeddings=true: SGLang makes lm_head the target embedding",
                "set tie_word_embeddings to false",
            )
        )
    if flat.get("norm_before_residual"):
        r.problems.append(
            (
                "fail",
                "norm_before_residual=true: SGLang's layer always keeps the raw hidden state as residual",
                "serve this draft in vLLM, or train with norm_before_residual=false",
            )
        )
    bias = bool(flat.get("bias", False))
    r.layout = read_layout(flat)
    layout = layout_tensors(**r.layout, num_aux=interp.config.num_aux)
    for name in interp.folder.tensors:
        bare = name[len(MODEL_PREFIX) :] if name.startswith(MODEL_PREFIX) else name
        if (
            bare in VOCAB_MAPS
            or bare in ("fc.weight", "norm.weight", "lm_head.weight", EMBED)
            or layer_param(bare, NATIVE_LAYER)
            or (bare == "fc.bias" and bias)
            or bare in layout
        ):
            r.loads[name] = bare
        else:
            r.dropped.append(name)  # SGLang's load_weights skips unmatched names silently
    no_head = ("lm_head.weight",) if r.draft_vocab_size is None else ()
    r.missing = missing(r.loads, no_head, layout)
    eagle = flat.get("eagle_config") or {}
    r.use_aux = bool(eagle.get("use_aux_hidden_state", True))
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    if nested:
        ids = list(nested)
        r.aux_layer_ids = SGLANG.eaglekit_ids(ids)  # SGLang adds +1 to these
        r.aux_source = f"nested eagle_config ids {ids} (SGLang adds 1: output of layer k)"
        if ids[0] != 1:  # sglang PR #25454: +1 only when the first id is 1; otherwise they are inputs of layer k
            r.aux_alternative = [i - 1 for i in ids]
    else:
        r.aux_layer_ids = defaults(target_layers)
        r.aux_source = DEFAULTS + (
            " (SGLang ignores top-level ids)" if flat.get("eagle_aux_hidden_state_layer_ids") else ""
        )
    return r


SGLANG = Format(
    name="sglang",
    title="SGLang",
    label="SGLang / SpecForge / ModelOpt (flat config, nested eagle_config)",
    layer_prefix="midlayer.",
    keeps_vocab_maps=True,
    aux_offset=0,
    aux_field="eagle_config.eagle_aux_hidden_state_layer_ids",
    aux_field_ids=aux_field_ids,
    aux_ids_name="nested ids",
    aux_source="nested eagle_config ids (output of layer k)",
    recognises=recognises,
    write_config=write_config,
    engine_reading=engine_reading,
    fc_only_if_widths_differ=True,
    older_miss_last_layer=True,
    without_draft_vocab_size="SGLang replaces the draft's lm_head by the target's full head",
    drops=drops,
    missing_where=missing_where,
    rename_layers="rename layers.0.* to midlayer.* (every SGLang version loads those)",
)
