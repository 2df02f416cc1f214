"""Aux-state capture equals HF's output_hidden_states on tiny targets of many architectures."""

import pytest
import torch
from safetensors.torch import load_file

from eaglekit.errors import EaglekitError
from eaglekit.features.capture import capture_features
from eaglekit.features.conversations import Sample
from eaglekit.targets.capture import capture_aux_states, check_fused_width, decoder_layers
from eaglekit.targets.load import load_target
from tiny import ARCHITECTURES, LAYERS, MOE_ARCHITECTURES, save_tiny_target, tiny_model

AUX = [1, 3, 5]


@pytest.mark.parametrize("arch", sorted(set(ARCHITECTURES) | set(MOE_ARCHITECTURES)))
def test_capture_matches_output_hidden_states(arch):
    model = tiny_model(arch, seed=1)
    assert len(decoder_layers(model)) == LAYERS
    ids = torch.randint(3, 300, (2, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding on one row
    got = capture_aux_states(model, ids, AUX, attention_mask=mask)
    ref = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    H = model.config.hidden_size
    assert got.aux_hidden.shape == (2, 11, len(AUX) * H)
    for slot, layer in enumerate(AUX):
        # hidden_states[i + 1] is the output of 0-based decoder layer i
        torch.testing.assert_close(got.aux_hidden[..., slot * H : (slot + 1) * H], ref.hidden_states[layer + 1])
    torch.testing.assert_close(got.logits, ref.logits)
    torch.testing.assert_close(got.last_hidden, ref.hidden_states[-1])


@pytest.mark.parametrize("arch", sorted(set(ARCHITECTURES) | set(MOE_ARCHITECTURES)))
def test_right_padding_is_dropped_and_real_tokens_keep_their_states(arch):
    """Rows padded on the right run without the mask (the causal kernel); their real tokens get what
    HF gives with the mask."""
    from eaglekit.targets.capture import causal_mask_suffices

    model = tiny_model(arch, seed=1)
    ids = torch.randint(3, 300, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    assert causal_mask_suffices(mask) and not causal_mask_suffices(mask.flip(1))
    got = capture_aux_states(model, ids, AUX, attention_mask=mask)
    assert not got.aux_hidden.requires_grad and not got.logits.requires_grad  # capture keeps no graph
    ref = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    H = model.config.hidden_size
    for slot, layer in enumerate(AUX):
        torch.testing.assert_close(
            got.aux_hidden[..., slot * H : (slot + 1) * H][real], ref.hidden_states[layer + 1][real]
        )
    torch.testing.assert_close(got.logits[real], ref.logits[real])


def test_capture_without_logits_gives_same_states():
    model = tiny_model("qwen3", seed=2)
    ids = torch.randint(3, 300, (1, 7))
    a = capture_aux_states(model, ids, AUX)
    b = capture_aux_states(model, ids, AUX, return_logits=False)
    assert b.logits is None
    torch.testing.assert_close(a.aux_hidden, b.aux_hidden)
    torch.testing.assert_close(a.last_hidden, b.last_hidden)


def test_hooks_are_removed_after_capture():
    model = tiny_model("llama")
    capture_aux_states(model, torch.randint(3, 300, (1, 4)), AUX)
    assert all(not layer._forward_hooks for layer in decoder_layers(model))


@pytest.mark.parametrize(
    "bad, expected",
    [
        ([1, 3, LAYERS], rf"ids \[{LAYERS}\] are outside .*expected 0\.\.{LAYERS - 1}"),
        ([-1, 2, 3], rf"ids \[-1\] are outside .*expected 0\.\.{LAYERS - 1}"),
        ([2, 2, 3], r"\[2, 2, 3\] repeat a layer"),
    ],
)
def test_bad_aux_ids_name_expected_and_found(bad, expected):
    model = tiny_model("llama")
    with pytest.raises(EaglekitError, match=expected):
        capture_aux_states(model, torch.randint(3, 300, (1, 4)), bad)


def test_wrong_fused_width_names_both_values():
    with pytest.raises(EaglekitError, match=r"576 wide, expected 3 aux layers x 576 = 1728"):
        check_fused_width(576, num_aux=3, target_hidden=576)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_moe_features_of_a_padded_batch_equal_each_sample_alone(arch, tmp_path):
    """The features stage on tiny seeded MoE targets (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 with
    MLA; experts routed per token): conversations of different lengths captured in one right-padded
    batch get, token for token, the states and teacher HF gives each of them alone."""
    target = load_target(save_tiny_target(tmp_path / "target", arch, seed=3), device="cpu", dtype="float32")
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(f"s{i}", torch.randint(3, 300, (n,), generator=g), torch.ones(n, dtype=torch.bool))
        for i, n in enumerate((13, 7, 10))
    ]
    manifest = capture_features(
        target, samples, tmp_path / "features", aux_layer_ids=AUX, topk=8, batch_tokens=64, progress=False
    )
    assert manifest["counts"]["shards"] == 1 and manifest["target"]["architecture"] == type(target.model).__name__
    shard = load_file(str(tmp_path / "features" / "shard-00000.safetensors"))
    offsets = shard["offsets"].tolist()
    for i, s in enumerate(samples):
        with torch.no_grad():
            ref = target.model(input_ids=s.input_ids[None], output_hidden_states=True)
        expected = torch.cat([ref.hidden_states[layer + 1] for layer in AUX], dim=-1)[0]  # [T, 3H]
        got = shard["aux"][offsets[i] : offsets[i + 1]].float()
        torch.testing.assert_close(got, expected.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-3)
        assert torch.equal(shard["topk_ids"][offsets[i] : offsets[i + 1], 0].long(), ref.logits[0].argmax(-1))
