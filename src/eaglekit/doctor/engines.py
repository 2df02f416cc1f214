"""How each serving engine reads a draft folder: what it loads, drops, captures and uses.

This models the loading code of the engine versions docs/doctor.md lists under "Limits"
(SGLang `llama_eagle3.py` + `model_runner.py`; vLLM 0.32 `llama_eagle3.py`,
`configs/speculators/algos.py`, `gpu_model_runner.py`; EAGLE `ea_model.py` + `cnets.py`), so the
doctor can compare what the engine will do with what the draft was trained for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eaglekit.doctor.options import ENGINES  # noqa: F401 (the engines' names, declared with the options)
from eaglekit.formats.detect import Interpretation
from eaglekit.formats.names import EMBED, MODEL_PREFIX, NATIVE_LAYER, NATIVE_TENSORS, VOCAB_MAPS, native_name
from eaglekit.targets.info import default_aux_layer_ids, from_engine_convention

REQUIRED = tuple(n for n in NATIVE_TENSORS if n not in VOCAB_MAPS)
LAYER_PARAMS = tuple(n[len(NATIVE_LAYER):] for n in NATIVE_TENSORS if n.startswith(NATIVE_LAYER))
DEFAULTS = "the engine's default layers"


@dataclass
class EngineReading:
    """What one engine makes of a draft folder."""

    engine: str
    config: dict                                       # the flat config the engine builds the draft from
    loads: dict[str, str] = field(default_factory=dict)  # file tensor name -> native name it fills
    dropped: list[str] = field(default_factory=list)   # file names the engine ignores without a word
    refused: list[str] = field(default_factory=list)   # file names that make the engine fail to load
    missing: list[str] = field(default_factory=list)   # native tensors left at their init values
    aux_layer_ids: list[int] | None = None             # eaglekit convention: what the engine captures
    aux_alternative: list[int] | None = None           # what another version of the engine captures
    aux_source: str = ""
    use_aux: bool = True                               # False: one final state is fed and fc is skipped
    draft_vocab_size: int | None = None                # as the engine reads it (None: absent)
    norm_before_residual: bool = False
    embedding: str = "target"                          # "target" or "draft": whose embedding it uses
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (status, message, hint)


def defaults(num_layers: int | None) -> list[int] | None:
    return default_aux_layer_ids(num_layers) if num_layers else None


def read_as(engine: str, interp: Interpretation, *, target_vocab: int | None,
            target_layers: int | None) -> EngineReading:
    """Model how `engine` reads the folder behind `interp`."""
    reading = {"sglang": _sglang, "vllm": _vllm, "eagle": _eagle}[engine](interp, target_vocab, target_layers)
    if reading.aux_layer_ids is not None:
        # Engines capture while walking the layers, so the states are concatenated in layer order
        # (vLLM's set_aux_hidden_state_layers even stores sorted(set(ids))), whatever the config's order.
        reading.aux_layer_ids = sorted(set(reading.aux_layer_ids))
    return reading


def _layer_param(bare: str, prefix: str) -> bool:
    return bare.startswith(prefix) and bare[len(prefix):] in LAYER_PARAMS


def _missing(loads: dict[str, str], skip: tuple[str, ...] = ()) -> list[str]:
    return [n for n in REQUIRED if n not in loads.values() and n not in skip]


def _sglang(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = interp.flat
    r = EngineReading("sglang", config=flat, draft_vocab_size=flat.get("draft_vocab_size"))
    if interp.format == "vllm":
        r.problems.append(("fail", "SGLang does not read the speculators layout (transformer_layer_config)",
                           "export with `eaglekit export --format sglang`"))
    archs = flat.get("architectures") or []
    if "LlamaForCausalLMEagle3" not in archs:
        r.problems.append(("warn", f"architectures {archs} instead of LlamaForCausalLMEagle3: SGLang versions "
                           "differ in how they map other names", "declare LlamaForCausalLMEagle3"))
    if flat.get("tie_word_embeddings"):
        r.problems.append(("fail", "tie_word_embeddings=true: SGLang makes lm_head the target embedding",
                           "set tie_word_embeddings to false"))
    if flat.get("norm_before_residual"):
        r.problems.append(("fail", "norm_before_residual=true: SGLang's layer always keeps the raw hidden "
                           "state as residual", "serve this draft in vLLM, or train with norm_before_residual=false"))
    bias = bool(flat.get("bias", False))
    for name in interp.folder.tensors:
        bare = name[len(MODEL_PREFIX):] if name.startswith(MODEL_PREFIX) else name
        if bare in VOCAB_MAPS or bare in ("fc.weight", "norm.weight", "lm_head.weight", EMBED) \
                or _layer_param(bare, NATIVE_LAYER) or (bare == "fc.bias" and bias):
            r.loads[name] = bare
        else:
            r.dropped.append(name)  # SGLang's load_weights skips unmatched names silently
    no_head = ("lm_head.weight",) if r.draft_vocab_size is None else ()
    r.missing = _missing(r.loads, no_head)
    eagle = flat.get("eagle_config") or {}
    r.use_aux = bool(eagle.get("use_aux_hidden_state", True))
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    if nested:
        ids = list(nested)
        r.aux_layer_ids = from_engine_convention(ids, "sglang")  # SGLang adds +1 to these
        r.aux_source = f"nested eagle_config ids {ids} (SGLang adds 1: output of layer k)"
        if ids[0] != 1:  # sglang PR #25454: +1 only when the first id is 1
            r.aux_alternative = from_engine_convention(ids, "vllm")
    else:
        r.aux_layer_ids = defaults(target_layers)
        r.aux_source = DEFAULTS + (" (SGLang ignores top-level ids)" if flat.get("eagle_aux_hidden_state_layer_ids")
                                   else "")
    return r


def vllm_config(interp: Interpretation) -> dict:
    """The draft hf_config vLLM builds: speculators -> transformer_layer_config + EAGLE-3 fields."""
    if interp.format != "vllm":
        return dict(interp.flat)
    cfg = interp.folder.config
    flat = dict(cfg.get("transformer_layer_config") or {})
    flat["draft_vocab_size"] = cfg.get("draft_vocab_size")
    if cfg.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = cfg["target_hidden_size"]
    flat["norm_before_residual"] = cfg.get("norm_before_residual", True)  # vLLM's default for speculators
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        flat[key] = cfg.get(key, False)
    if cfg.get("eagle_aux_hidden_state_layer_ids"):
        flat["eagle_aux_hidden_state_layer_ids"] = cfg["eagle_aux_hidden_state_layer_ids"]
    return flat


def _speculators_problems(cfg: dict) -> list[tuple[str, str, str]]:
    """vLLM's `SpeculatorsConfig.validate_speculators_config` and `update_eagle3`, as checks."""
    out = []
    try:
        spec = cfg["speculators_config"]
        spec["proposal_methods"][0]["speculative_tokens"]
        spec["verifier"]["name_or_path"]
        cfg["speculators_model_type"]
    except (KeyError, IndexError, TypeError):
        out.append(("fail", "speculators_model_type, speculators_config.proposal_methods[0].speculative_tokens "
                    "or verifier.name_or_path is missing: vLLM refuses the config", "re-export with eaglekit"))
    if (cfg.get("transformer_layer_config") or {}).get("model_type", "llama") not in ("llama", "qwen3"):
        out.append(("fail", "transformer_layer_config.model_type must be llama or qwen3 for vLLM's EAGLE-3",
                    "write model_type llama"))
    if "norm_before_residual" not in cfg:
        out.append(("fail", "norm_before_residual is absent: vLLM then assumes true for speculators configs, "
                    "EAGLE-3/SGLang-style drafts need false", "write norm_before_residual explicitly"))
    return out


def _vllm(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = vllm_config(interp)
    r = EngineReading("vllm", config=flat, norm_before_residual=bool(flat.get("norm_before_residual", False)))
    r.draft_vocab_size = flat.get("draft_vocab_size") or flat.get("vocab_size")
    if interp.format == "vllm":
        r.problems += _speculators_problems(interp.folder.config)
    else:
        archs = flat.get("architectures") or []
        ok = [a for a in archs if a.startswith("Eagle3") or a.endswith("Eagle3") or a == "LlamaForCausalLM"]
        if not ok:
            r.problems.append(("fail", f"architectures {archs}: vLLM maps them to an unregistered Eagle3 class",
                               "declare LlamaForCausalLMEagle3"))
    if flat.get("norm_before_fc") or flat.get("fc_norm") or flat.get("norm_output"):
        r.problems.append(("fail", "norm_before_fc / fc_norm / norm_output drafts are not EAGLE-3 as eaglekit "
                           "runs it", "eaglekit cannot check this draft variant"))
    eagle = flat.get("eagle_config") or {}
    r.use_aux = bool(eagle.get("use_aux_hidden_state", True))
    own_map = r.draft_vocab_size != target_vocab
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
        if nat in REQUIRED or nat == EMBED:
            r.loads[name] = nat
        elif name.endswith(".bias"):
            r.dropped.append(name)  # AutoWeightsLoader ignores unexpected *.bias tensors
        else:
            r.refused.append(name)  # AutoWeightsLoader raises on unknown names
    r.missing = _missing(r.loads, () if r.use_aux else ("fc.weight",))
    r.embedding = "draft" if EMBED in r.loads.values() else "target"
    top = flat.get("eagle_aux_hidden_state_layer_ids")
    nested = eagle.get("eagle_aux_hidden_state_layer_ids")
    if top:
        r.aux_layer_ids = from_engine_convention(list(top), "vllm")
        r.aux_source = f"top-level ids {list(top)} (vLLM: input of layer k)"
    elif nested:
        # vLLM 0.32 falls back to the nested ids, read in its own convention; older versions ignore them.
        r.aux_layer_ids = from_engine_convention(list(nested), "vllm")
        r.aux_alternative = defaults(target_layers)
        r.aux_source = f"nested ids {list(nested)} read as top-level (vLLM: input of layer k)"
    else:
        r.aux_layer_ids = defaults(target_layers)
        r.aux_source = DEFAULTS
    return r


def _eagle(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = interp.flat
    r = EngineReading("eagle", config=flat, draft_vocab_size=flat.get("draft_vocab_size"))
    if interp.format == "vllm":
        r.problems.append(("fail", "EAGLE's code reads a flat Llama config, not the speculators layout",
                           "export with `eaglekit export --format eagle`"))
    if r.draft_vocab_size is None:
        r.problems.append(("fail", "EAGLE's loader asserts draft_vocab_size in the config", "write draft_vocab_size"))
    if "bias" not in flat:
        r.problems.append(("warn", "no `bias` key: EAGLE assumes bias=true", "write \"bias\": false"))
    same_vocab = r.draft_vocab_size == flat.get("vocab_size")
    params = {"fc.weight", "norm.weight", "lm_head.weight", EMBED} | {NATIVE_LAYER + p for p in LAYER_PARAMS}
    if not same_vocab:
        params |= set(VOCAB_MAPS)
    for name in interp.folder.tensors:
        if name in params:
            r.loads[name] = name
        elif not (same_vocab and name in VOCAB_MAPS):  # EAGLE deletes d2t/t2d for equal vocabularies
            r.dropped.append(name)  # load_state_dict(strict=False) ignores everything else
    r.missing = _missing(r.loads)
    # EAGLE loads the target's embedding only when the config has no target_hidden_size.
    r.embedding = "draft" if "target_hidden_size" in flat else "target"
    r.aux_layer_ids = defaults(target_layers)
    r.aux_source = "EAGLE's hard-coded layers (inputs of 2, N//2, N-3)"
    return r
