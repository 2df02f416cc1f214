"""The draft model: shapes and config for many target layouts, SGLang names, frozen embedding, checkpoint."""

import pytest
import torch

from eaglekit.draft.checkpoint import load_draft, save_draft
from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft
from tiny import ARCHITECTURES, tiny_config

torch.set_num_threads(1)

SGLANG_NAMES = {
    "fc.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_draft_shapes_follow_the_target(arch):
    tc = tiny_config(arch)
    cfg = DraftConfig.for_target(tc, aux_layer_ids=[1, 3, 5], draft_vocab_size=100)
    heads, kv = tc.num_attention_heads, tc.num_key_value_heads or tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        tc.hidden_size,
        heads,
        kv,
        head_dim,
    )
    assert cfg.max_position_embeddings >= tc.max_position_embeddings
    assert cfg.rope_parameters["rope_theta"] == tc.rope_parameters["rope_theta"]
    draft = Eagle3Draft(cfg)
    sd = draft.draft_state_dict()
    assert set(sd) == SGLANG_NAMES
    H = tc.hidden_size
    assert sd["fc.weight"].shape == (H, 3 * H)
    assert sd["midlayer.self_attn.q_proj.weight"].shape == (heads * head_dim, 2 * H)
    assert sd["midlayer.self_attn.k_proj.weight"].shape == (kv * head_dim, 2 * H)
    assert sd["midlayer.self_attn.o_proj.weight"].shape == (H, heads * head_dim)
    assert sd["lm_head.weight"].shape == (100, H)
    assert sd["d2t"].dtype == torch.int64 and sd["d2t"].shape == (100,)
    assert sd["t2d"].dtype == torch.bool and sd["t2d"].shape == (tc.vocab_size,)
    assert not draft.embed_tokens.weight.requires_grad
    B, T = 2, 5
    logits, hidden, (k, v) = draft(torch.randint(0, tc.vocab_size, (B, T)), draft.fuse(torch.randn(B, T, 3 * H)))
    assert logits.shape == (B, T, 100) and hidden.shape == (B, T, H) and k.shape == (B, kv, T, head_dim)


def test_head_dim_other_than_hidden_over_heads():
    tc = tiny_config("qwen3")
    tc.head_dim = 32  # 4 heads x 32 = 128 != hidden 64
    cfg = DraftConfig.for_target(tc, aux_layer_ids=[1, 3, 5], draft_vocab_size=50)
    assert cfg.head_dim == 32
    draft = Eagle3Draft(cfg)
    assert draft.midlayer.self_attn.q_proj.weight.shape == (4 * 32, 128)
    logits, _, _ = draft(torch.randint(0, 300, (1, 4)), torch.randn(1, 4, 64))
    assert logits.shape == (1, 4, 50)


def test_scaled_rope_is_copied_and_pinned_to_the_target_length():
    tc = tiny_config("llama")
    tc.rope_parameters = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0}
    tc.max_position_embeddings = 1024
    cfg = DraftConfig.for_target(tc, aux_layer_ids=[1, 3, 5], draft_vocab_size=50)
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 4.0
    assert cfg.rope_parameters["original_max_position_embeddings"] == 1024
    assert cfg.max_position_embeddings >= 1024
    again = DraftConfig.from_hf_dict(cfg.to_hf_dict())
    assert again.rope_parameters == cfg.rope_parameters
    assert cfg.to_hf_dict()["rope_scaling"]["rope_type"] == "yarn"
    Eagle3Draft(cfg)  # the rotary embedding accepts it


def test_partial_rotary_factor_is_not_copied():
    tc = tiny_config("phi3")
    tc.rope_parameters = {**tc.rope_parameters, "partial_rotary_factor": 0.5}
    cfg = DraftConfig.for_target(tc, aux_layer_ids=[1, 3, 5], draft_vocab_size=50)
    assert "partial_rotary_factor" not in cfg.rope_parameters


def test_checkpoint_round_trip_keeps_every_tensor(tmp_path):
    cfg = DraftConfig.for_target(tiny_config("llama"), aux_layer_ids=[1, 3, 5], draft_vocab_size=60)
    torch.manual_seed(3)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        draft.d2t.copy_(torch.arange(60))
        draft.t2d[::2] = True
    emb = torch.randn(cfg.vocab_size, cfg.hidden_size)
    save_draft(draft, tmp_path)
    again = load_draft(tmp_path, target_embedding=emb)
    for name, t in draft.draft_state_dict().items():
        assert torch.equal(again.draft_state_dict()[name], t), name
    assert torch.equal(again.embed_tokens.weight, emb)
