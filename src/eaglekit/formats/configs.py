"""config.json for each format, written from a `DraftConfig` (docs/serving-formats.md §4).

- sglang: the flat Llama-style config SGLang reads (`LlamaForCausalLMEagle3`, `draft_vocab_size`,
  nested `eagle_config` ids in SGLang's convention). It is the native config cast for serving.
- vllm: the `speculators` layout vLLM detects by `speculators_model_type` (`transformer_layer_config`,
  `speculators_config`, top-level ids in vLLM's convention, `norm_before_residual` explicit, since
  vLLM assumes true when it is absent).
- eagle: the config of EAGLE's `traineagle3` (`LlamaForCausalLM`, no layer ids: EAGLE captures the
  inputs of layers 2, N//2, N-3 hard-coded, so only the default ids can be exported).

Every format also carries an `eaglekit` block (aux ids in eaglekit's convention, the target layer
count, the format) so a later import or doctor never has to guess a convention.
"""

from __future__ import annotations

from eaglekit import __version__
from eaglekit.artifacts import AUX_CONVENTION
from eaglekit.draft.config import DraftConfig
from eaglekit.errors import EaglekitError
from eaglekit.formats.options import ExportOptions
from eaglekit.targets.info import default_aux_layer_ids, to_engine_convention

SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
EAGLE_ARCHITECTURE = "LlamaForCausalLM"
# EAGLE's own code builds rotary embeddings from `rope_scaling["type"]` and knows only these.
EAGLE_ROPE_TYPES = ("default", "linear", "dynamic")


def eaglekit_block(cfg: DraftConfig, fmt: str, extra: dict | None = None) -> dict:
    block = {
        "aux_layer_ids": list(cfg.aux_layer_ids),
        "aux_layer_convention": AUX_CONVENTION,
        "target_num_layers": cfg.target_num_layers,
        "format": fmt,
        "version": __version__,
    }
    block.update(extra or {})
    return block


def sglang_config(cfg: DraftConfig, extra: dict | None = None) -> dict:
    """SGLang's config: the native one (already in SGLang's names and convention)."""
    d = cfg.to_hf_dict()
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = to_engine_convention(cfg.aux_layer_ids, "sglang")
    d["num_aux_hidden_states"] = cfg.num_aux  # newer SGLang sizes fc by it (sglang PR #24663)
    d["eaglekit"] = eaglekit_block(cfg, "sglang", extra)
    return d


def layer_config(cfg: DraftConfig) -> dict:
    """The Llama decoder-layer config vLLM builds the draft from (`transformer_layer_config`)."""
    d = cfg.to_hf_dict()
    for key in ("architectures", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                "eagle_config", "eaglekit"):
        d.pop(key)
    d["num_aux_hidden_states"] = cfg.num_aux  # vLLM sizes fc by it (else 3; top-level ids do not count)
    return d


def vllm_config(cfg: DraftConfig, *, verifier: str | None, verifier_architectures: list[str],
                speculative_tokens: int = ExportOptions.speculative_tokens, extra: dict | None = None) -> dict:
    """The speculators config (`Eagle3SpeculatorConfig`) that vLLM loads natively."""
    return {
        "architectures": [SPECULATORS_ARCHITECTURE],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer_config(cfg),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,  # vLLM assumes true when absent
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": to_engine_convention(cfg.aux_layer_ids, "vllm"),
        "torch_dtype": "bfloat16",
        "eaglekit": eaglekit_block(cfg, "vllm", extra),
    }


def eagle_rope_scaling(cfg: DraftConfig) -> dict | None:
    rope = dict(cfg.rope_parameters)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in EAGLE_ROPE_TYPES:
        raise EaglekitError(f"EAGLE's code supports rope types {EAGLE_ROPE_TYPES}, this draft uses {kind!r}",
                            hint="export for sglang or vllm instead")
    extra = sorted(set(rope) - {"rope_type", "type", "rope_theta", "factor"})
    if kind != "default" and extra:
        raise EaglekitError(f"EAGLE's rope_scaling holds only type and factor; this draft's rope also sets {extra}",
                            hint="export for sglang or vllm instead")
    return None if kind == "default" else {"type": kind, "factor": rope["factor"]}


def eagle_config(cfg: DraftConfig, extra: dict | None = None) -> dict:
    """EAGLE's `traineagle3` config.json. Refuses what EAGLE's code cannot represent."""
    problems = []
    if cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size:
        problems.append(f"head_dim {cfg.head_dim} x {cfg.num_attention_heads} heads != hidden {cfg.hidden_size} "
                        "(EAGLE derives head_dim = hidden / heads)")
    if cfg.num_aux != 3:
        problems.append(f"{cfg.num_aux} aux layers (EAGLE's fc reads exactly 3)")
    if cfg.target_hidden_size != cfg.hidden_size:
        problems.append("target_hidden_size != hidden_size (EAGLE then expects the embedding in the checkpoint)")
    if cfg.norm_before_residual:
        problems.append("norm_before_residual=true (EAGLE's layer keeps the raw hidden state as residual)")
    if cfg.target_num_layers is None:
        problems.append("the target's layer count is unknown (pass --target)")
    else:
        N = cfg.target_num_layers
        default = default_aux_layer_ids(N)  # EAGLE captures the inputs of layers 2, N//2, N-3
        if list(cfg.aux_layer_ids) != default:
            problems.append(f"aux layer ids {list(cfg.aux_layer_ids)} are not EAGLE's hard-coded {default}")
    if problems:
        raise EaglekitError("EAGLE's format cannot hold this draft: " + "; ".join(problems),
                            hint="export with --format sglang or --format vllm")
    rope = dict(cfg.rope_parameters)
    return {
        "architectures": [EAGLE_ARCHITECTURE],
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
        "rope_scaling": eagle_rope_scaling(cfg),
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "tie_word_embeddings": False,
        "bias": False,  # EAGLE reads `bias` and assumes true when it is absent
        "torch_dtype": "bfloat16",
        "eaglekit": eaglekit_block(cfg, "eagle", extra),
    }
