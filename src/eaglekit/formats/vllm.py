"""vLLM's format: the `speculators` layout (`Eagle3Speculator`) vLLM detects by `speculators_model_type`.

The decoder layer is written `layers.0.*`; the config nests the Llama layer config in
`transformer_layer_config` beside the EAGLE-3 fields, writes the aux ids top-level as the input of
layer k (= output of k-1, so eaglekit's ids + 1) and `norm_before_residual` explicitly, since vLLM
assumes true when it is absent (docs/serving-formats.md §1, §2, §4). vLLM has no
draft_id_to_target_id parameter when the vocabularies are equal (it then refuses a `d2t` tensor),
so the vocab maps are left out then. The reader models vLLM 0.32's `llama_eagle3.py`,
`configs/speculators/algos.py` and `gpu_model_runner.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.draft.config import LAYOUT_KEYS
from eaglekit.errors import EaglekitError
from eaglekit.formats.base import (
    DEFAULTS,
    REQUIRED,
    EngineReading,
    Format,
    defaults,
    eaglekit_block,
    missing,
)
from eaglekit.formats.names import EMBED, MODEL_PREFIX, layout_tensors, native_name, read_layout

if TYPE_CHECKING:  # annotations only
    from eaglekit.draft.config import DraftConfig
    from eaglekit.formats.detect import Interpretation
    from eaglekit.formats.facts import TargetFacts

ARCHITECTURE = "Eagle3Speculator"
# The EAGLE-3 fields a speculators config holds beside its transformer_layer_config.
SPECULATORS_FIELDS = (
    "draft_vocab_size",
    "target_hidden_size",
    "norm_before_residual",
    *LAYOUT_KEYS,
    "eagle_aux_hidden_state_layer_ids",
)


def recognises(config: dict) -> bool:
    if "speculators_model_type" in config or "speculators_config" in config:  # vLLM keys on the latter
        if config.get("speculators_model_type", "eagle3") != "eagle3":
            raise EaglekitError(
                f"speculators model type {config['speculators_model_type']!r} is not EAGLE-3",
                hint="eaglekit reads eagle3 speculators only",
            )
        return True
    return False


def aux_field_ids(flat: dict) -> list | None:
    return flat.get("eagle_aux_hidden_state_layer_ids")


def flat_config(config: dict) -> dict:
    """The flat Llama-style config of the draft: its layer config plus the EAGLE-3 fields."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise EaglekitError(
            "speculators config has no transformer_layer_config object",
            hint="the config is incomplete; vLLM refuses it too",
        )
    flat = dict(layer)
    flat.update({k: config[k] for k in SPECULATORS_FIELDS if k in config})
    return flat


def layer_config(cfg: DraftConfig) -> dict:
    """The Llama decoder-layer config vLLM builds the draft from (`transformer_layer_config`)."""
    d = cfg.to_hf_dict()
    for key in (
        "architectures",
        "draft_vocab_size",
        "target_hidden_size",
        "norm_before_residual",
        *LAYOUT_KEYS,
        "eagle_config",
        "eaglekit",
    ):
        d.pop(key)
    d["num_aux_hidden_states"] = cfg.num_aux  # vLLM sizes fc by it (else 3; top-level ids do not count)
    return d


def write_config(
    cfg: DraftConfig, *, facts: TargetFacts | None, speculative_tokens: int, extra: dict | None = None
) -> dict:
    """The speculators config (`Eagle3SpeculatorConfig`) that vLLM loads natively; `facts` names the verifier."""
    return {
        "architectures": [ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer_config(cfg),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": facts.path if facts else None,
                "architectures": [facts.architecture] if facts else [],
            },
        },
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,  # vLLM assumes true when absent
        **cfg.layout(),
        "eagle_aux_hidden_state_layer_ids": VLLM.engine_ids(cfg.aux_layer_ids),
        "torch_dtype": "bfloat16",
        "eaglekit": eaglekit_block(cfg, "vllm", extra),
    }


def engine_config(interp: Interpretation) -> dict:
    """The draft hf_config vLLM builds: speculators -> transformer_layer_config + EAGLE-3 fields."""
    if interp.format != "vllm":
        return dict(interp.flat)
    cfg = interp.folder.config
    flat = dict(cfg.get("transformer_layer_config") or {})
    flat["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = cfg["target_hidden_size"]
    flat["norm_before_residual"] = cfg.get("norm_before_residual", True)  # vLLM's default for speculators
    for key in LAYOUT_KEYS:
        flat[key] = cfg.get(key, False)
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        flat["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    return flat


def speculative_tokens(config: dict) -> int | None:
    """The draft tokens per step a speculators config names: vLLM serves at them when given no
    num_speculative_tokens."""
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    return methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None


def fc_inputs(flat: dict) -> int:
    """The aux states vLLM sizes fc for: num_aux_hidden_states, else the nested ids' count, else 3."""
    nested = (flat.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return flat.get("num_aux_hidden_states") or (len(nested) if nested else 3)


def speculators_problems(cfg: dict) -> list[tuple[str, str, str]]:
    """vLLM's `SpeculatorsConfig.validate_speculators_config` and `update_eagle3`, as checks."""
    out = []
    try:
        spec = cfg["speculators_config"]
        spec["proposal_methods"][0]["speculative_tokens"]
        spec["verifier"]["name_or_path"]
        cfg["speculators_model_type"]
    except (KeyError, IndexError, TypeError):
        out.append(
            (
                "fail",
                "speculators_model_type, speculators_config.proposal_methods[0].speculative_tokens "
                "or verifier.name_or_path is missing: vLLM refuses the config",
                "re-export with eaglekit",
            )
        )
    if (cfg.get("transformer_layer_config") or {}).get("model_type", "llama") not in ("llama", "qwen3"):
        out.append(
            (
                "fail",
                "transformer_layer_config.model_type must be llama or qwen3 for vLLM's EAGLE-3",
                "write model_type llama",
            )
        )
    if "norm_before_residual" not in cfg:
        out.append(
            (
                "fail",
                "norm_before_residual is absent: vLLM then assumes true for speculators configs, "
                "EAGLE-3/SGLang-style drafts need false",
                "write norm_before_residual explicitly",
            )
        )
    return out


def engine_reading(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = engine_config(interp)
    r = EngineReading("vllm", config=flat, norm_before_residual=bool(flat.get("norm_before_residual", False)))
    r.draft_vocab_size = flat.get("draft_vocab_size") or flat.get("vocab_size")
    if interp.format == "vllm":
        r.problems += speculators_problems(interp.folder.config)
    else:
        archs = flat.get("architectures") or []
        ok = [a for a in archs if a.startswith("Eagle3") or a.endswith("Eagle3") or a == "LlamaForCausalLM"]
        if not ok:
            r.problems.append(
                (
                    "fail",
                    f"architectures {archs}: vLLM maps them to an unregistered Eagle3 class",
                    "declare LlamaForCausalLMEagle3",
                )
            )
    eagle = flat.get("eagle_config") or {}
    r.use_aux = bool(eagle.get("use_aux_hidden_state", True))
    own_map = r.draft_vocab_size != target_vocab
    r.layout = read_layout(flat, use_aux_norm=False)
    if not r.use_aux:  # one final state is fed: no fc, and no norm before it
        r.layout.update(fc_norm=False, norm_before_fc=False)
    layout = layout_tensors(**r.layout, num_aux=interp.config.num_aux)
    for name in interp.folder.tensors:
        if "t2d" in name:
            continue  # vLLM skips t2d
        if "d2t" in name:
            if own_map or flat.get("draft_vocab_size") is None:  # absent: the draft_vocab_size check says so
                r.loads[name] = "d2t"
            else:
                r.refused.append(name)  # no draft_id_to_target_id parameter when the vocabularies are equal
            continue
        if name.startswith(MODEL_PREFIX) and "lm_head" not in name:
            r.refused.append(name)  # vLLM prepends `model.` unconditionally -> model.model.*
            continue
        nat, _ = native_name(name)
        if nat == "fc.weight" and not r.use_aux:
            continue  # fc is not built and its weights are skipped silently (the aux_states check)
        if nat in REQUIRED or nat == EMBED or nat in layout:
            r.loads[name] = nat
        elif nat == "input_norm.weight":
            r.dropped.append(name)  # mapped to nothing unless norm_before_fc
        elif name.endswith(".bias"):
            r.dropped.append(name)  # AutoWeightsLoader ignores unexpected *.bias tensors
        else:
            r.refused.append(name)  # AutoWeightsLoader raises on unknown names
    r.missing = missing(r.loads, () if r.use_aux else ("fc.weight",), layout)
    r.embedding = "draft" if EMBED in r.loads.values() else "target"
    top = flat.get("eagle_aux_hidden_state_layer_ids")
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    if top:
        r.aux_layer_ids = VLLM.eaglekit_ids(list(top))
        r.aux_source = f"top-level ids {list(top)} (vLLM: input of layer k)"
    elif nested:
        # vLLM 0.32 falls back to the nested ids, read in its own convention; older versions ignore them.
        r.aux_layer_ids = VLLM.eaglekit_ids(list(nested))
        r.aux_alternative = defaults(target_layers)
        r.aux_source = f"nested ids {list(nested)} read as top-level (vLLM: input of layer k)"
    else:
        r.aux_layer_ids = defaults(target_layers)
        r.aux_source = DEFAULTS
    return r


VLLM = Format(
    name="vllm",
    title="vLLM",
    label="speculators (vLLM's native format)",
    layer_prefix="layers.0.",
    keeps_vocab_maps=False,
    aux_offset=1,
    aux_field="top-level eagle_aux_hidden_state_layer_ids",
    aux_field_ids=aux_field_ids,
    aux_ids_name="top-level ids",
    aux_source="top-level ids (vLLM convention: input of layer k)",
    recognises=recognises,
    write_config=write_config,
    engine_reading=engine_reading,
    flat_config=flat_config,
    by_layout=True,
    speculative_tokens=speculative_tokens,
    fc_inputs=fc_inputs,
    without_draft_vocab_size="vLLM sizes lm_head by the full vocab_size and the draft head no longer fits",
    without_lm_head="no lm_head.weight: vLLM uses the target's head cut to the first draft_vocab_size ids "
    "(wrong tokens for a pruned vocab)",
)
