"""The real SmolLM2 tokenizer's loss masks (the tiny families' are in tests/unit/test_chat.py)."""

from __future__ import annotations

import pytest

from chat_masks import CONVERSATIONS, Family, check_masks


@pytest.mark.slow
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_smollm2_real_tokenizer(smollm2_dir, conversation):
    """The real SmolLM2 tokenizer and its own ChatML template (default system message injected)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    family = Family("smollm2", [], None, "<|im_end|>", lambda a, last, kw: a + "<|im_end|>")
    check_masks(tok, CONVERSATIONS[conversation], family)
    if conversation == "single":
        assert "You are a helpful AI assistant named SmolLM" in tok.apply_chat_template(
            CONVERSATIONS[conversation], tokenize=False
        )
