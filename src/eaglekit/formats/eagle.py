"""EAGLE's own format: the config and checkpoint of SafeAILab/EAGLE's `traineagle3`.

A flat `LlamaForCausalLM` config with no layer ids: EAGLE captures the inputs of layers 2, N//2 and
N-3, hard-coded (eaglekit's default ids + 1), so only drafts on the default ids can be exported.
Names are the native ones; EAGLE deletes its d2t/t2d buffers when the vocabularies are equal, so
they are left out then. The reader models EAGLE's `ea_model.py` and `cnets.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglekit.draft.config import LAYOUT_KEYS  # EAGLE-3.1's flags, which EAGLE's code lacks
from eaglekit.errors import EaglekitError
from eaglekit.formats.base import LAYER_PARAMS, EngineReading, Format, defaults, eaglekit_block, missing
from eaglekit.formats.names import EMBED, NATIVE_LAYER, VOCAB_MAPS, read_layout
from eaglekit.targets.aux import default_aux_layer_ids

if TYPE_CHECKING:  # annotations only
    from eaglekit.draft.config import DraftConfig
    from eaglekit.formats.detect import Interpretation

ARCHITECTURE = "LlamaForCausalLM"
# EAGLE's own code builds rotary embeddings from `rope_scaling["type"]` and knows only these.
ROPE_TYPES = ("default", "linear", "dynamic")


def recognises(config: dict) -> bool:
    return True  # no mark of its own: the format a config without another's marks is written in


def rope_scaling(cfg: DraftConfig) -> dict | None:
    rope = dict(cfg.rope_parameters)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise EaglekitError(
            f"EAGLE's code supports rope types {ROPE_TYPES}, this draft uses {kind!r}",
            hint="export for sglang or vllm instead",
        )
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", "factor"})
    if kind != "default" and extra:
        raise EaglekitError(
            f"EAGLE's rope_scaling holds only type and factor; this draft's rope also sets {extra}",
            hint="export for sglang or vllm instead",
        )
    return None if kind == "default" else {"type": kind, "factor": rope["factor"]}


def write_config(
    cfg: DraftConfig, *, facts=None, speculative_tokens: int | None = None, extra: dict | None = None
) -> dict:
    """EAGLE's `traineagle3` config.json. Refuses what EAGLE's code cannot represent."""
    problems = []
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        problems.append(
            f"head_dim {cfg.head_dim} x {cfg.num_attention_heads} heads != hidden {cfg.hidden_size} "
            "(EAGLE derives head_dim = hidden / heads)"
        )
    if cfg.num_aux != 3:
        problems.append(f"{cfg.num_aux} aux layers (EAGLE's fc reads exactly 3)")
    if cfg.target_hidden_size != cfg.hidden_size:
        problems.append("target_hidden_size != hidden_size (EAGLE then expects the embedding in the checkpoint)")
    if cfg.norm_before_residual:
        problems.append("norm_before_residual=true (EAGLE's layer keeps the raw hidden state as residual)")
    problems += [f"{key}=true (EAGLE's draft has no EAGLE-3.1 norms)" for key in LAYOUT_KEYS if getattr(cfg, key)]
    if cfg.target_num_layers is None:
        problems.append("the target's layer count is unknown (pass --target)")
    else:
        N = cfg.target_num_layers
        default = default_aux_layer_ids(N)  # EAGLE captures the inputs of layers 2, N//2, N-3
        if list(cfg.aux_layer_ids) != default:
            problems.append(f"aux layer ids {list(cfg.aux_layer_ids)} are not EAGLE's hard-coded {default}")
    if problems:
        raise EaglekitError(
            "EAGLE's format cannot hold this draft: " + "; ".join(problems),
            hint="export with --format sglang or --format vllm",
        )
    rope = dict(cfg.rope_parameters)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_scaling": rope_scaling(cfg),
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "bias": False,  # EAGLE reads `bias` and assumes true when it is absent
        "torch_dtype": "bfloat16",
        "eaglekit": eaglekit_block(cfg, "eagle", extra),
    }


def engine_reading(interp: Interpretation, target_vocab, target_layers) -> EngineReading:
    flat = interp.flat
    r = EngineReading("eagle", config=flat, draft_vocab_size=flat.get("draft_vocab_size"))
    if interp.format == "vllm":
        r.problems.append(
            (
                "fail",
                "EAGLE's code reads a flat Llama config, not the speculators layout",
                "export with `eaglekit export --format eagle`",
            )
        )
    if r.draft_vocab_size is None:
        r.problems.append(("fail", "EAGLE's loader asserts draft_vocab_size in the config", "write draft_vocab_size"))
    if "bias" not in flat:
        r.problems.append(("warn", "no `bias` key: EAGLE assumes bias=true", 'write "bias": false'))
    layout = [key for key, on in read_layout(flat).items() if on]  # EAGLE builds none of them
    if layout:
        r.problems.append(
            (
                "fail",
                f"{', '.join(layout)}: EAGLE's draft has no EAGLE-3.1 norms and would run another model",
                "serve this draft in SGLang or vLLM",
            )
        )
    same_vocab = r.draft_vocab_size == flat.get("vocab_size")
    params = {"fc.weight", "norm.weight", "lm_head.weight", EMBED} | {NATIVE_LAYER + p for p in LAYER_PARAMS}
    if not same_vocab:
        params |= set(VOCAB_MAPS)
    for name in interp.folder.tensors:
        if name in params:
            r.loads[name] = name
        elif not (same_vocab and name in VOCAB_MAPS):  # EAGLE deletes d2t/t2d for equal vocabularies
            r.dropped.append(name)  # load_state_dict(strict=False) ignores everything else
    r.missing = missing(r.loads)
    # EAGLE loads the target's embedding only when the config has no target_hidden_size.
    r.embedding = "draft" if "target_hidden_size" in flat else "target"
    r.aux_layer_ids = defaults(target_layers)
    r.aux_source = "EAGLE's hard-coded layers (inputs of 2, N//2, N-3)"
    return r


EAGLE = Format(
    name="eagle",
    title="EAGLE",
    label="EAGLE traineagle3 (flat LlamaForCausalLM config, no layer ids)",
    layer_prefix="midlayer.",
    keeps_vocab_maps=True,
    aux_offset=1,
    recognises=recognises,
    write_config=write_config,
    engine_reading=engine_reading,
    fc_only_if_widths_differ=True,
    without_draft_vocab_size="EAGLE's loader refuses the config",
    rename_layers="rename layers.0.* to midlayer.*",
    holds_layout=False,
)
