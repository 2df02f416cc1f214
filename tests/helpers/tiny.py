"""Tiny seeded random targets of several architectures, and a tiny ChatML tokenizer.

Everything here is built offline in a few hundred milliseconds: no download, no network.
"""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 384
HIDDEN = 64
LAYERS = 8

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Per-architecture overrides on top of the common tiny shape; MoE/MLA fields kept minimal.
ARCH_OVERRIDES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "mistral": {"sliding_window": None},
    "gemma": {"head_dim": 16},
    "phi3": {"pad_token_id": 0},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "head_dim": 16,
    },
    "deepseek_v3": {
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "num_key_value_heads": 4,
        "rope_interleave": False,
    },
}
ARCHITECTURES = tuple(ARCH_OVERRIDES)
# Also built, outside ARCHITECTURES (the capture tests take them; no engine runner is claimed for them).
EXTRA_OVERRIDES = {
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}
MOE_ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def tiny_config(arch: str = "llama", *, num_layers: int = LAYERS, vocab_size: int = VOCAB):
    from transformers import AutoConfig

    kwargs = dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update({**ARCH_OVERRIDES, **EXTRA_OVERRIDES}[arch])
    return AutoConfig.for_model(arch, **kwargs)


def tiny_model(arch: str = "llama", *, seed: int = 0, **config_kwargs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **config_kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init at std 0.02 gives near-uniform logits; a larger std gives peaked, varied ones.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    return model.eval()


TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Write a Python function that adds two numbers: def add(a, b): return a + b",
    "Count from one to ten: 1 2 3 4 5 6 7 8 9 10.",
    "Hello! How can I help you today? I am a helpful assistant.",
    "Solve 12 * 7 = 84. Then 84 + 16 = 100.",
]


def tiny_tokenizer(vocab_size: int = VOCAB):
    """A byte-level BPE tokenizer with ChatML special tokens: ids 0 <unk>, 1 <|im_start|>, 2 <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    fast.chat_template = CHATML
    return fast


def save_tiny_target(folder: Path, arch: str = "llama", *, seed: int = 0, **config_kwargs) -> Path:
    """Write a tiny target as an HF folder (safetensors + tokenizer + chat template)."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(arch, seed=seed, vocab_size=len(tokenizer), **config_kwargs)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def without_name(fingerprint: dict) -> dict:
    """A target's fingerprint less its name: a GGUF or source folder and the folder prepared from it share the rest."""
    return {k: v for k, v in fingerprint.items() if k != "name"}
