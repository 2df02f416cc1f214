"""The real SmolLM2 GGUF: its info, and one fingerprint for it and its prepared folder."""

import pytest

from eaglekit.targets import target_info


@pytest.mark.slow
def test_smollm2_info_from_gguf():
    info = target_info("smollm2")
    assert (info.num_layers, info.hidden_size, info.vocab_size) == (30, 576, 49152)
    assert info.aux_layer_ids == [1, 14, 26]
    assert info.eos_token == "<|im_end|>"
