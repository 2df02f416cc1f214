"""Magpie synthesis: the pre-query template derived from several chat templates (SmolLM2 writing its
own prompts is in tests/integration/test_data_synth.py)."""

from __future__ import annotations

import pytest

from eaglekit.data.magpie import SENTINEL, pre_query_template
from eaglekit.errors import EaglekitError
from engine_tiny import one_thread  # noqa: F401 (fixture)

LLAMA3 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
    " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
GEMMA = (
    "{{ '<bos>' }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role'])"
    " + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<start_of_turn>model\n' }}{% endif %}"
)
MISTRAL = (
    "{{ '<s>' }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% else %}{{ m['content'] + '</s>' }}{% endif %}{% endfor %}"
)
# SmolLM2-style: a default system prompt when none is given.
CHATML_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}"
    "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_END = "{% for m in messages %}{{ 'User: ' + m['content'] + '\n' }}{% endfor %}"


@pytest.fixture
def tok(tiny_tok):
    import copy

    tok = copy.deepcopy(tiny_tok)
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<bos>",
                "<start_of_turn>",
                "<end_of_turn>",
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
            ]
        }
    )
    return tok


@pytest.mark.parametrize(
    "template, system, prefix, end",
    [
        (None, None, "<|im_start|>user\n", "<|im_end|>"),
        (None, "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n", "<|im_end|>"),
        (
            CHATML_DEFAULT_SYSTEM,
            None,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n",
            "<|im_end|>",
        ),
        (LLAMA3, None, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>"),
        (GEMMA, None, "<bos><start_of_turn>user\n", "<end_of_turn>"),
        (MISTRAL, None, "<s>[INST] ", "[/INST]"),
    ],
)
def test_pre_query_template_is_cut_from_the_chat_template(tok, template, system, prefix, end):
    if template:
        tok.chat_template = template
    pre = pre_query_template(tok, system)
    assert (pre.text, pre.end_of_turn) == (prefix, end)
    assert pre.end_of_turn_id == tok.convert_tokens_to_ids(end) and SENTINEL not in pre.text


def test_a_template_without_an_end_of_turn_token_is_refused(tok):
    tok.chat_template = NO_END
    with pytest.raises(EaglekitError, match="no special token ends the user's turn"):
        pre_query_template(tok)
