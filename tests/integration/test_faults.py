"""A GGUF and the folder prepared from it are one target: the real SmolLM2's."""

from __future__ import annotations

import pytest

from engine_tiny import one_thread  # noqa: F401 (fixture)
from tiny import without_name


@pytest.mark.slow
def test_the_gguf_and_its_prepared_folder_share_one_fingerprint(smollm2_dir):
    from eaglekit.formats.facts import target_facts

    gguf, prepared = target_facts("smollm2").fingerprint, target_facts(str(smollm2_dir)).fingerprint
    assert without_name(gguf) == without_name(prepared) and gguf["weights_hash"]
