"""`DraftConfig`: the draft's shape, written as the flat Llama-style config.json engines read.

The serialized field names are exactly those SGLang / vLLM / EAGLE read (docs/serving-formats.md §4).
Aux layer ids are kept in eaglekit's convention (output of 0-based target layer i) under
`eaglekit.aux_layer_ids`; the nested `eagle_config` carries them in SGLang's convention, which for
this convention is the same numbers. Exports for other engines convert at the edge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from eaglekit.artifacts import AUX_CONVENTION
from eaglekit.errors import EaglekitError

ARCHITECTURE = "LlamaForCausalLMEagle3"
LAYOUT_KEYS = ("fc_norm", "norm_before_fc", "norm_output")  # EAGLE-3.1's layout flags (`DraftConfig`)
DRAFT_VOCAB_SIZE = 32000  # the default rows of a draft lm_head (EAGLE-3 and SpecForge use 32k)


@dataclass(frozen=True, kw_only=True)
class DraftConfig:
    hidden_size: int  # must equal the target's (the draft reads its embedding)
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # rows of lm_head; mapped to target ids through d2t
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]  # eaglekit convention: output of 0-based target layer i
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096  # never smaller than the target's
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    hidden_act: str = "silu"
    norm_before_residual: bool = False  # EAGLE-3 / SGLang: the residual is the raw hidden state
    # EAGLE-3.1's layouts, under the names SGLang and vLLM read (docs/contracts.md, "Draft layouts"):
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states (`input_norm`)
    fc_norm: bool = False  # an RMSNorm per aux state (`fc_norm.{i}`), after input_norm when both are set
    norm_output: bool = False  # the next step reads the normed output, not the pre-norm one
    target_num_layers: int | None = None

    @property
    def num_aux(self) -> int:
        return len(self.aux_layer_ids)

    @property
    def fused_width(self) -> int:
        return self.num_aux * self.target_hidden_size

    @classmethod
    def for_target(
        cls, target_config, *, aux_layer_ids: list[int], draft_vocab_size: int, intermediate_size: int | None = None
    ) -> "DraftConfig":
        """The draft shape EAGLE-3 uses for a target: one decoder layer with the target's heads.

        Args:
            target_config: the target's (text) config.
            aux_layer_ids: eaglekit convention ids.
            draft_vocab_size: rows of the draft's lm_head.
            intermediate_size: the MLP width (default: the target's; MoE targets fall back to 4H).
        """
        from eaglekit.targets.load import text_config  # torch: not at import (the options read this module)

        cfg = text_config(target_config)
        heads = cfg.num_attention_heads
        rope = draft_rope_parameters(cfg)
        width = intermediate_size or getattr(cfg, "intermediate_size", None) or 4 * cfg.hidden_size
        if draft_vocab_size > cfg.vocab_size:
            raise EaglekitError(
                f"draft_vocab_size {draft_vocab_size} exceeds the target vocab {cfg.vocab_size}",
                hint="choose draft_vocab_size <= the target's vocab size",
            )
        return cls(
            hidden_size=cfg.hidden_size,
            intermediate_size=width,
            num_attention_heads=heads,
            num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            vocab_size=cfg.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=cfg.hidden_size,
            aux_layer_ids=tuple(aux_layer_ids),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6) or 1e-6),
            max_position_embeddings=max(4096, int(getattr(cfg, "max_position_embeddings", 0) or 0)),
            rope_parameters=rope,
            target_num_layers=cfg.num_hidden_layers,
        )

    def to_hf_dict(self) -> dict:
        """config.json in the flat Llama style engines read (SGLang names), plus eaglekit's block."""
        rope = dict(self.rope_parameters)
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": rope.get("rope_theta"),
            "rope_scaling": scaling if scaling.get("rope_type", "default") != "default" else None,
            "rope_parameters": rope,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "norm_before_residual": self.norm_before_residual,
            **self.layout(),
            "torch_dtype": "bfloat16",
            "eagle_config": {
                "use_aux_hidden_state": True,
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),  # SGLang convention == ours
            },
            "eaglekit": {
                "aux_layer_ids": list(self.aux_layer_ids),
                "aux_layer_convention": AUX_CONVENTION,
                "target_num_layers": self.target_num_layers,
            },
        }

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DraftConfig":
        """Read a native config.json (as written by `to_hf_dict`)."""
        block = d.get("eaglekit")
        if not block or "aux_layer_ids" not in block:
            raise EaglekitError(
                "config.json is not an eaglekit native draft config (no 'eaglekit' block)",
                hint="for SGLang/vLLM/EAGLE folders use `eaglekit import DIR --out CKPT`",
            )
        missing = [
            k
            for k in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "draft_vocab_size")
            if d.get(k) is None
        ]
        if missing:
            raise EaglekitError(f"draft config.json lacks {missing}", hint="the file is incomplete")
        rope = d.get("rope_parameters") or {"rope_type": "default", "rope_theta": d.get("rope_theta", 10000.0)}
        heads = d["num_attention_heads"]
        return cls(
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            vocab_size=d["vocab_size"],
            draft_vocab_size=d["draft_vocab_size"],
            target_hidden_size=d.get("target_hidden_size") or d["hidden_size"],
            aux_layer_ids=tuple(block["aux_layer_ids"]),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            rope_parameters=rope,
            hidden_act=d.get("hidden_act", "silu"),
            norm_before_residual=bool(d.get("norm_before_residual", False)),
            **{key: bool(d.get(key, False)) for key in LAYOUT_KEYS},
            target_num_layers=block.get("target_num_layers"),
        )

    def layout(self) -> dict[str, bool]:
        """The EAGLE-3.1 layout flags, by their config names."""
        return {key: getattr(self, key) for key in LAYOUT_KEYS}

    def to_dict(self) -> dict:
        return asdict(self)

    def llama_config(self):
        """A transformers LlamaConfig with the draft's rope settings (for its rotary embedding)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=dict(self.rope_parameters),
            num_hidden_layers=1,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
        )


CONFIG_FIELDS = tuple(f.name for f in fields(DraftConfig))


def draft_rope_parameters(cfg) -> dict:
    """The target's rope parameters as the draft's one Llama layer must use them.

    The rope type, theta and scaling are copied. Two fields are pinned so the draft's rotation never
    depends on where it is loaded: `partial_rotary_factor` is dropped (the draft layer rotates its
    whole head, as the engines' Llama draft does), and scaled rope types get an explicit
    `original_max_position_embeddings` (otherwise yarn/dynamic would read the draft's own, larger,
    `max_position_embeddings` and rotate differently from the target).
    """
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    rope.pop("partial_rotary_factor", None)
    rope.setdefault("rope_type", "default")
    rope.setdefault("rope_theta", float(getattr(cfg, "rope_theta", 10000.0) or 10000.0))
    target_max = getattr(cfg, "max_position_embeddings", None)
    if rope["rope_type"] != "default" and target_max and "original_max_position_embeddings" not in rope:
        rope["original_max_position_embeddings"] = int(target_max)
    return rope
