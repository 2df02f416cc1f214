"""What a user needs to know about a target before training a draft for it.

`target_info` reads only the config and tokenizer (no weights), so it is fast even for large
targets. Aux layer ids are reported in every convention the engines use (docs/contracts.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eaglekit.errors import EaglekitError
from eaglekit.targets.load import generation_eos_ids, load_tokenizer, target_fingerprint, text_config
from eaglekit.targets.source import TargetSource, resolve_target


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layers as outputs of 0-based layers: [1, N//2-1, N-4]."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(ids)) != 3 or min(ids) < 0:
        raise EaglekitError(
            f"a target with {num_layers} layers has no distinct default aux layers ({ids})",
            hint="pass aux_layer_ids explicitly, e.g. --aux-layer-ids 0,1,2",
        )
    return ids


def check_aux_layer_ids(aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """Validate ids in eaglekit's convention (output of 0-based layer i)."""
    ids = [int(i) for i in aux_layer_ids]
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise EaglekitError(
            f"aux layer ids {bad} are outside the target's layers (expected 0..{num_layers - 1}, "
            f"the output of 0-based decoder layer i)", hint=f"the default is {default_aux_layer_ids(num_layers)}")
    if len(set(ids)) != len(ids):
        raise EaglekitError(f"aux layer ids {ids} repeat a layer", hint="give distinct layers")
    return ids


def to_engine_convention(aux_layer_ids: list[int], engine: str) -> list[int]:
    """Convert internal ids (output of layer i) to the ids an engine's config expects.

    sglang: nested `eagle_config.eagle_aux_hidden_state_layer_ids`, SGLang adds +1 itself.
    vllm / eagle / speculators: id k means "input of layer k" = output of layer k-1, so +1.
    trtllm: `eagle3_layers_to_capture`, output of layer k, unchanged.
    """
    if engine in ("sglang", "trtllm"):
        return list(aux_layer_ids)
    if engine in ("vllm", "eagle", "speculators"):
        return [i + 1 for i in aux_layer_ids]
    raise EaglekitError(f"unknown engine {engine!r}", hint="use sglang, vllm, eagle or trtllm")


def from_engine_convention(ids: list[int], engine: str) -> list[int]:
    if engine in ("sglang", "trtllm"):
        return list(ids)
    if engine in ("vllm", "eagle", "speculators"):
        return [i - 1 for i in ids]
    raise EaglekitError(f"unknown engine {engine!r}", hint="use sglang, vllm, eagle or trtllm")


@dataclass
class TargetInfo:
    name: str
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None
    max_position_embeddings: int | None
    rope_parameters: dict | None
    tie_word_embeddings: bool
    has_chat_template: bool
    eos_token: str | None
    aux_layer_ids: list[int]
    aux_layer_ids_sglang: list[int]
    aux_layer_ids_vllm: list[int]
    aux_layer_convention: str
    config_hash: str
    tokenizer_hash: str
    weights_hash: str

    def to_dict(self) -> dict:
        return asdict(self)


def load_config(source: TargetSource, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        if source.kind == "gguf":
            return AutoConfig.from_pretrained(source.path.parent, gguf_file=source.path.name)
        return AutoConfig.from_pretrained(source.path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise EaglekitError(f"could not read the config of {source.path}: {err}",
                            hint="is this a transformers model?") from err


def target_info(spec: str | TargetSource, *, tokenizer=None, config=None) -> TargetInfo:
    """Describe a target from its config and tokenizer, without loading its weights."""
    source = spec if isinstance(spec, TargetSource) else resolve_target(spec)
    config = config if config is not None else load_config(source)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(source, generation_eos_ids(source, config))
    cfg = text_config(config)
    num_layers = cfg.num_hidden_layers
    ids = default_aux_layer_ids(num_layers)
    fp = target_fingerprint(config, tokenizer, source)
    heads = cfg.num_attention_heads
    return TargetInfo(
        name=source.name,
        architecture=fp["architecture"],
        model_type=cfg.model_type,
        num_layers=num_layers,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        intermediate_size=getattr(cfg, "intermediate_size", None),
        max_position_embeddings=getattr(cfg, "max_position_embeddings", None),
        rope_parameters=getattr(cfg, "rope_parameters", None),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        eos_token=tokenizer.eos_token,
        aux_layer_ids=ids,
        aux_layer_ids_sglang=to_engine_convention(ids, "sglang"),
        aux_layer_ids_vllm=to_engine_convention(ids, "vllm"),
        aux_layer_convention="output of 0-based decoder layer i (pre final norm)",
        config_hash=fp["config_hash"],
        tokenizer_hash=fp["tokenizer_hash"],
        weights_hash=fp["weights_hash"],
    )
