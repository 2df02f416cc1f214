"""The real default target: draft shape, target parts read without loading it, features and a few steps."""

import pytest
import torch

from eaglekit.features.capture import capture_features
from eaglekit.features.conversations import tokenize_conversations
from eaglekit.targets.load import load_target
from eaglekit.train.config import TrainConfig
from eaglekit.train.loop import train
from eaglekit.train.target_parts import load_target_parts

torch.set_num_threads(1)

ROWS = [
    {"id": f"s{i}", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for i, (q, a) in enumerate(
        [
            ("What is 2 plus 2?", "2 plus 2 equals 4."),
            ("Name a color.", "Blue is a color."),
            ("Say hello.", "Hello! How can I help you today?"),
            ("What is the capital of France?", "The capital of France is Paris."),
            ("Count to five.", "1, 2, 3, 4, 5."),
            ("Is water wet?", "Yes, water makes things wet."),
        ]
    )
]


@pytest.mark.slow
def test_smollm2_parts_features_and_training(smollm2_dir, tmp_path, monkeypatch):
    from eaglekit.train import target_parts

    def no_full_load(*a, **k):
        raise AssertionError("the whole target was loaded to read two tensors")

    monkeypatch.setattr(target_parts, "load_target", no_full_load)
    parts = load_target_parts(smollm2_dir)
    monkeypatch.undo()
    target = load_target(str(smollm2_dir))
    assert parts.fingerprint["config_hash"] == target.fingerprint()["config_hash"]
    assert torch.equal(parts.embedding, target.model.get_input_embeddings().weight)
    assert torch.equal(parts.lm_head, parts.embedding)  # SmolLM2 ties them
    assert target.tokenizer.convert_ids_to_tokens(parts.stop_token_ids) == ["<|im_end|>"]

    samples, _ = tokenize_conversations(target.tokenizer, ROWS, max_length=128)
    capture_features(
        target, samples, tmp_path / "feat", aux_layer_ids=[1, 14, 26], topk=8, batch_tokens=512, progress=False
    )
    manifest = train(
        TrainConfig(
            target=str(smollm2_dir),
            features=str(tmp_path / "feat"),
            out=str(tmp_path / "run"),
            draft_vocab_size=64,
            allow_smaller_vocab=True,
            ttt_steps=2,
            max_steps=3,
            val_data=str(tmp_path / "feat"),
            val_fraction=0.0,
            val_every=3,
            batch_tokens=512,
            progress=False,
            device="cpu",
        )
    )
    from eaglekit.draft.checkpoint import load_draft

    draft = load_draft(tmp_path / "run")
    cfg = draft.config
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (576, 9, 3, 64)
    assert cfg.rope_parameters["rope_theta"] == 100000.0 and cfg.max_position_embeddings >= 8192
    assert cfg.aux_layer_ids == (1, 14, 26) and cfg.fused_width == 3 * 576
    best = manifest["best"]
    assert best["data_greedy_agreement"] < 1.0  # hand-written answers are not SmolLM2's greedy ones
    assert manifest["target"]["config_hash"] == parts.fingerprint["config_hash"]
