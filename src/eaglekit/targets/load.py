"""Load a target (HF folder or GGUF) as a plain `AutoModelForCausalLM` plus its tokenizer.

A GGUF target is dequantized by transformers and then rebuilt as the plain model class, so the
rest of eaglekit (and `save_pretrained`) never sees a quantized model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from eaglekit.artifacts import sha256_json
from eaglekit.errors import EaglekitError
from eaglekit.targets.source import TargetSource, resolve_target
from eaglekit.targets.weights import weights_fingerprint

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# Config fields that define the computation; names, paths, dtypes and versions are left out so the
# GGUF original and its prepared HF folder share one fingerprint.
STRUCTURAL_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "hidden_act",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "sliding_window",
)


@dataclass
class Target:
    """A loaded target: the model, its tokenizer and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    source: TargetSource
    stop_token_ids: list[int] = field(default_factory=list)

    @property
    def config(self):
        return text_config(self.model.config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def fingerprint(self) -> dict:
        return target_fingerprint(self.model.config, self.tokenizer, self.source)


def text_config(config):
    """The decoder's own config (multimodal configs nest it as `text_config`)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def resolve_device(device: str) -> str:
    """ "auto" -> "cuda" when a CUDA device is available, else "cpu"; any other name as given, but a
    CUDA device on a machine without one is refused here, before anything loads onto it."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EaglekitError(f"device {device!r} asked for, but no CUDA device is available", hint="use --device cpu")
    return device


def dtype_name(dtype: str) -> str:
    """A dtype flag's full name ("bf16" -> "bfloat16", "fp32" -> "float32"), as vLLM and the reports
    spell it; any other name ("auto", vLLM's "half") as given."""
    return str(DTYPES[dtype]).removeprefix("torch.") if dtype in DTYPES else dtype


def engine_dtype_name(dtype: str, device: str = "auto") -> str:
    """The full name of the dtype an engine that loads the checkpoint itself (vLLM) gets: "auto"
    resolved by eaglekit's one rule (bf16 on CUDA, fp32 on CPU), as the HF path resolves it, and
    never passed on: vLLM's own "auto" downcasts a float32 checkpoint (the run folder's target/) to the
    platform's first dtype: bf16 on x86 CPUs (vllm.platforms.cpu), where the HF path computes in fp32."""
    return dtype_name(str(resolve_dtype(dtype, resolve_device(device))).removeprefix("torch."))


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise EaglekitError(f"unknown dtype {dtype!r}", hint=f"use one of {sorted(DTYPES)} or auto")
    return DTYPES[dtype]


def config_fingerprint(config) -> str:
    cfg = text_config(config).to_dict()
    return sha256_json({k: cfg.get(k) for k in STRUCTURAL_KEYS if cfg.get(k) is not None})


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return sha256_json(
        {
            "vocab": vocab,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "special": {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id")},
        }
    )


def architecture_name(config) -> str:
    """`LlamaForCausalLM` etc.; GGUF configs carry no `architectures`, so derive it from model_type."""
    if getattr(config, "architectures", None):
        return config.architectures[0]
    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type, type(config).__name__)


def target_fingerprint(config, tokenizer, source: TargetSource) -> dict:
    """Identity of a target for manifests: refused when a later stage sees another target.

    Config and tokenizer are hashed whole, the weights by a sample of their files (`weights.py`),
    so a fine-tune with the same config is another target.
    """
    cfg = text_config(config)
    return {
        "name": source.name,
        "architecture": architecture_name(config),
        "config_hash": config_fingerprint(config),
        "tokenizer_hash": tokenizer_fingerprint(tokenizer),
        "weights_hash": weights_fingerprint(source),
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
    }


def load_tokenizer(source: TargetSource, gen_eos: list[int] | None = None):
    """Load the target's tokenizer; make its EOS agree with the model's generation config.

    Args:
        source: the resolved target.
        gen_eos: the generation config's EOS ids if already known (saves re-reading a GGUF).
    """
    try:
        if source.kind == "gguf":
            tok = AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
        else:
            tok = AutoTokenizer.from_pretrained(source.path)
    except Exception as err:
        raise EaglekitError(
            f"could not load the tokenizer of {source.path}: {err}",
            hint="the folder needs tokenizer.json / tokenizer_config.json",
        ) from err
    gen_eos = generation_eos_ids(source) if gen_eos is None else gen_eos
    if gen_eos and tok.eos_token_id not in gen_eos:
        # GGUF metadata of some models (SmolLM2) names <|im_start|> as EOS while generation stops at
        # <|im_end|>; a wrong EOS would make every loss mask and stop rule wrong, so fix it loudly.
        fixed = tok.convert_ids_to_tokens(gen_eos[0])
        log.warning(
            "tokenizer EOS %r disagrees with the generation config (%s); using %r", tok.eos_token, gen_eos, fixed
        )
        tok.eos_token = fixed
    return tok


def generation_eos_ids(source: TargetSource, config=None) -> list[int]:
    """EOS ids generation stops at: generation_config.json, else the model config's."""
    try:
        if source.kind == "hf_dir" and (source.path / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(source.path).eos_token_id
        else:
            if config is None:
                config = (
                    AutoConfig.from_pretrained(source.path.parent, gguf_file=source.path.name)
                    if source.kind == "gguf"
                    else AutoConfig.from_pretrained(source.path)
                )
            eos = getattr(config, "eos_token_id", None)
    except (OSError, ValueError) as err:
        # A broken generation config would silently change where every answer stops.
        raise EaglekitError(
            f"could not read the EOS ids of {source.path}: {err}",
            hint="generation_config.json / config.json is corrupt; fix or remove it",
        ) from err
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def stop_token_ids(gen_eos: list[int], tokenizer) -> list[int]:
    """Ids generation stops at: the generation config's EOS ids and the tokenizer's EOS, sorted."""
    return sorted(set(gen_eos) | {tokenizer.eos_token_id} - {None})


def load_target(
    spec: str | Path | TargetSource,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    trust_remote_code: bool = False,
) -> Target:
    """Load a target model and tokenizer.

    Args:
        spec: `smollm2`, an HF model folder, a `.gguf` file, or a resolved `TargetSource`.
        device: where to put the model ("cpu", "cuda", "cuda:1"); ignored with `device_map`.
        dtype: "auto" (bf16 on GPU, fp32 on CPU), "float32", "bfloat16" or "float16".
        device_map: passed to transformers for targets larger than one GPU (e.g. "auto").
        trust_remote_code: only when the user asks for it.

    Returns:
        A `Target` whose model is in eval mode with gradients off.
    """
    source = spec if isinstance(spec, TargetSource) else resolve_target(spec)
    torch_dtype = resolve_dtype(dtype, device)
    kwargs = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code)
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        if source.kind == "gguf":
            model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name, **kwargs)
            model = dequantized_copy(model)
        else:
            model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
    except EaglekitError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise EaglekitError(
            f"could not load target {source.path}: {type(err).__name__}: {err}",
            hint="is it a complete causal-LM checkpoint? (`eaglekit target info` checks files)",
        ) from err
    if device_map is None:
        model.to(device)
    model.eval().requires_grad_(False)
    gen_eos = generation_eos_ids(source, model.config)
    tokenizer = load_tokenizer(source, gen_eos)
    return Target(model=model, tokenizer=tokenizer, source=source, stop_token_ids=stop_token_ids(gen_eos, tokenizer))


def dequantized_copy(model: torch.nn.Module) -> torch.nn.Module:
    """Rebuild a GGUF-loaded model as its plain class (transformers refuses to save GGUF models)."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    state = model.state_dict()
    with torch.device("meta"):
        plain = type(model)(config)
    plain.load_state_dict(state, assign=True, strict=False)
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise EaglekitError(
            f"GGUF conversion left parameters unset: {missing[:5]}",
            hint="this GGUF architecture is not fully supported by transformers",
        )
    # Non-persistent buffers (rotary inv_freq) are not in the state dict: take them from the original.
    buffers = dict(model.named_buffers())
    for name, buf in list(plain.named_buffers()):
        if buf.is_meta:
            module_name, _, attr = name.rpartition(".")
            plain.get_submodule(module_name)._buffers[attr] = buffers[name]
    plain.generation_config = model.generation_config
    return plain
