"""What a user needs to know about a target before training a draft for it.

`target_info` reads only the config and tokenizer (no weights), so it is fast even for large
targets. Aux layer ids are reported in eaglekit's convention (`targets/aux.py`); the `target info`
command adds them as each format's config writes them (`formats/target_cli.py`, docs/contracts.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from transformers import AutoConfig

from eaglekit.errors import EaglekitError
from eaglekit.targets.aux import check_aux_layer_ids, default_aux_layer_ids  # noqa: F401 (check_...: scripts import it here)
from eaglekit.targets.load import generation_eos_ids, load_tokenizer, target_fingerprint, text_config
from eaglekit.targets.source import TargetSource, resolve_target


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
    aux_layer_convention: str
    config_hash: str
    tokenizer_hash: str
    weights_hash: str

    def to_dict(self) -> dict:
        return asdict(self)


def load_config(source: TargetSource, trust_remote_code: bool = False):
    try:
        if source.kind == "gguf":
            return AutoConfig.from_pretrained(source.path.parent, gguf_file=source.path.name)
        return AutoConfig.from_pretrained(source.path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise EaglekitError(
            f"could not read the config of {source.path}: {err}", hint="is this a transformers model?"
        ) from err


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
        aux_layer_convention="output of 0-based decoder layer i (pre final norm)",
        config_hash=fp["config_hash"],
        tokenizer_hash=fp["tokenizer_hash"],
        weights_hash=fp["weights_hash"],
    )
