"""Assistant loss masks against real chat templates of several families (tests/assets/chat_templates).

Each family gets the tiny byte-level BPE tokenizer of tests/helpers/tiny.py plus that family's special tokens
(flags as in the real tokenizer: Qwen3's <think>/</think> are not special, Phi-3's turn tokens strip
the whitespace after them), its bos/eos and its real template. The checks: each assistant turn's
masked tokens decode to exactly what the model writes in that turn (its text, the end-of-turn token,
and Qwen3's think wrapper in the last turn), nothing else is masked, all ids decode to the rendered
text, and a single-turn conversation's ids before the answer are the generation prompt's ids.
"""

from __future__ import annotations

import copy
import random
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken

from chat_masks import A1, A2, CONVERSATIONS, Q1, Q2, SYSTEM, Family, check_masks, runs
from eaglekit.errors import EaglekitError
from eaglekit.features import conversations as conversations_mod
from eaglekit.features.conversations import tokenize_conversations
from eaglekit.targets.chat import assistant_spans, common_prefix, prompt_ids, render, tokenize_conversation
from tiny import tiny_tokenizer

TEMPLATES = Path(__file__).parents[1] / "assets" / "chat_templates"
THINK = "<think>\n\n</think>\n\n"  # what Qwen3 writes before an answer without reasoning


def qwen3_written(answer: str, last: bool, kwargs: dict) -> str:
    thinking = kwargs.get("enable_thinking", True) and last
    return (THINK if thinking else "") + answer + "<|im_end|>"


FAMILIES = {
    "qwen2_5": Family("qwen2_5", ["<|endoftext|>"], None, "<|im_end|>", lambda a, last, kw: a + "<|im_end|>"),
    "llama3_1": Family(
        "llama3_1",
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "<|begin_of_text|>",
        "<|eot_id|>",
        lambda a, last, kw: a.strip() + "<|eot_id|>",
    ),
    "qwen3": Family("qwen3", ["<|endoftext|>"], None, "<|im_end|>", qwen3_written, plain=["<think>", "</think>"]),
    "mistral_nemo": Family(
        "mistral_nemo",
        ["<s>", "</s>", "[INST]", "[/INST]"],
        "<s>",
        "</s>",
        lambda a, last, kw: a + "</s>",
        system="unmaskable",
    ),
    "mistral_v3": Family(
        "mistral_v3",
        ["<s>", "</s>", "[INST]", "[/INST]"],
        "<s>",
        "</s>",
        lambda a, last, kw: " " + a + "</s>",
        system="refused",
    ),
    "gemma2": Family(
        "gemma2",
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        "<bos>",
        "<eos>",
        lambda a, last, kw: a.strip() + "<end_of_turn>",
        system="refused",
    ),
    "gemma3": Family(
        "gemma3",
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        "<bos>",
        "<eos>",
        lambda a, last, kw: a.strip() + "<end_of_turn>",
    ),
    "phi3": Family(
        "phi3",
        ["<|endoftext|>"],
        "<s>",
        "<|endoftext|>",
        lambda a, last, kw: a + "<|end|>",
        rstrip=["<|assistant|>", "<|system|>", "<|user|>", "<|end|>"],
    ),
}


@lru_cache(maxsize=1)
def base_tokenizer():
    return tiny_tokenizer()


@lru_cache(maxsize=None)
def family_tokenizer(name: str):
    family = FAMILIES[name]
    tok = copy.deepcopy(base_tokenizer())
    tok.add_tokens(
        [
            AddedToken(t, special=True, normalized=False, rstrip=t in family.rstrip)
            for t in family.specials + [t for t in family.rstrip if t not in family.specials]
        ],
        special_tokens=True,
    )
    if family.plain:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.plain])
    if family.bos and family.bos not in tok.get_vocab():
        tok.add_tokens([AddedToken(family.bos, special=True, normalized=False)], special_tokens=True)
    tok.bos_token, tok.eos_token = family.bos, family.eos
    tok.chat_template = (TEMPLATES / f"{family.template}.jinja").read_text()
    return tok


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_masks(name, conversation):
    family, messages = FAMILIES[name], CONVERSATIONS[conversation]
    tok = family_tokenizer(name)
    if messages[0]["role"] == "system" and family.system != "ok":
        match = "refused" if family.system == "refused" else "differently"
        with pytest.raises(EaglekitError, match=match):
            tokenize_conversation(tok, messages)
        return
    check_masks(tok, messages, family)


@pytest.mark.parametrize("conversation", ["single", "multi", "system_multi", "ends_with_user"])
@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_thinking_modes(thinking, conversation):
    """enable_thinking=False puts the empty think block in the prompt; the default lets the model write it."""
    tok = family_tokenizer("qwen3")
    check_masks(tok, CONVERSATIONS[conversation], FAMILIES["qwen3"], enable_thinking=thinking)


def test_qwen3_reasoning_turns():
    tok, family = family_tokenizer("qwen3"), FAMILIES["qwen3"]
    reasoned = {"role": "assistant", "content": "<think>\nParis is in France.\n</think>\n\nParis."}
    # Last turn: the model writes its reasoning in the think wrapper.
    result = tokenize_conversation(tok, [Q1, reasoned])
    assert (
        tok.decode(runs(result.input_ids, result.loss_mask)[0])
        == "<think>\nParis is in France.\n</think>\n\nParis.<|im_end|>"
    )
    # Past turn: the template drops its reasoning, in both modes; only the answer is masked.
    for thinking in (True, False):
        result = tokenize_conversation(tok, [Q1, reasoned, Q2, A2], enable_thinking=thinking)
        assert [tok.decode(r) for r in runs(result.input_ids, result.loss_mask)] == [
            "Paris.<|im_end|>",
            qwen3_written(A2["content"], True, {"enable_thinking": thinking}),
        ]
        assert "Paris is in France" not in tok.decode(result.input_ids)
    # Thinking disabled but the last answer holds reasoning: the prompt's empty think block is not in the text.
    with pytest.raises(EaglekitError, match="cannot be masked exactly"):
        tokenize_conversation(tok, [Q1, reasoned], enable_thinking=False)
    check_masks(tok, [Q1, reasoned, Q2, A2], family)


def test_templates_that_trim_answers():
    """Llama 3.1 and Gemma trim the answer; the mask holds the trimmed text the model writes."""
    padded = [Q1, {"role": "assistant", "content": "  Paris.\n\n"}]
    for name in ("llama3_1", "gemma2", "gemma3"):
        check_masks(family_tokenizer(name), padded, FAMILIES[name])


def chatml_with(template: str):
    tok = copy.deepcopy(base_tokenizer())
    tok.chat_template = template
    return tok


def test_template_rewriting_answers_raises():
    upper = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper if m.role == 'assistant' "
        "else m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(EaglekitError, match="not found verbatim") as err:
        tokenize_conversation(chatml_with(upper), [Q1, A1])
    assert "cannot be masked exactly" in err.value.hint


def test_template_without_end_of_turn_token_raises():
    plain = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    with pytest.raises(EaglekitError, match="no end-of-turn special token"):
        tokenize_conversation(chatml_with(plain), [Q1, A1])
    # Headers are special but the answer has no end token: the next header must not pass for one.
    headers = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(EaglekitError, match="no end-of-turn special token"):
        tokenize_conversation(chatml_with(headers), [Q1, A1, Q2])


def test_answer_holding_a_special_token_raises():
    tok = family_tokenizer("qwen2_5")
    with pytest.raises(EaglekitError, match="not found verbatim"):
        tokenize_conversation(tok, [Q1, {"role": "assistant", "content": "Paris<|im_end|> and more"}])


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "empty conversation"),
        ([{"role": "bot", "content": "hi"}], "message 0 is malformed"),
        ([Q1, {"role": "assistant", "content": None}], "message 1 is malformed"),
        ([Q1, "hello"], "message 1 is malformed"),
        ([{"role": "user"}], "message 0 is malformed"),
        ([A1, Q1, A1], "starts with an assistant turn"),
    ],
)
def test_malformed_messages(messages, match):
    tok = family_tokenizer("qwen2_5")
    with pytest.raises(EaglekitError, match=match):
        tokenize_conversation(tok, messages)
    if "assistant turn" not in match:
        with pytest.raises(EaglekitError, match=match):
            prompt_ids(tok, messages)


def test_template_refusing_roles():
    tok = family_tokenizer("gemma2")
    with pytest.raises(EaglekitError, match="refused.*alternate"):
        tokenize_conversation(tok, [Q1, Q2, A1])


def test_tokenizer_without_template():
    tok = copy.deepcopy(base_tokenizer())
    tok.chat_template = None
    for call in (tokenize_conversation, prompt_ids):
        with pytest.raises(EaglekitError, match="no chat template"):
            call(tok, [Q1, A1])


def test_max_length_truncates():
    tok = family_tokenizer("qwen2_5")
    whole = tokenize_conversation(tok, CONVERSATIONS["multi"])
    cut = tokenize_conversation(tok, CONVERSATIONS["multi"], max_length=7)
    assert cut.input_ids == whole.input_ids[:7] and cut.loss_mask == whole.loss_mask[:7]


def one_by_one(tok, messages: list[dict], max_length: int) -> tuple[list[int], list[int]]:
    """Ids and mask as tokenize_conversation made them before batching: one tokenizer.encode per text."""

    def encode(text):
        return tok.encode(text, add_special_tokens=False) if text else []

    full = render(tok, messages, add_generation_prompt=False)
    spans = assistant_spans(tok, messages, full)
    ids = encode(full[: spans[0][0]])
    mask = [0] * len(ids)
    for n, (start, end) in enumerate(spans):
        piece = encode(full[start : spans[n + 1][0] if n + 1 < len(spans) else len(full)])
        written = encode(full[start:end])
        assert piece[: len(written)] == written
        ids += piece
        mask += [1] * len(written) + [0] * (len(piece) - len(written))
    return ids[:max_length], mask[:max_length]


def varied_rows(n: int) -> list[dict]:
    """Single- and multi-turn conversations (some with a system message, some ending with a user turn)."""
    words = "Paris river ☕ café 42 the of, and\n - **bold** `code` (x) 3.14 é".split(" ")
    rows = []
    for i in range(n):
        messages = [SYSTEM] if i % 4 == 0 else []
        for turn in range(1 + i % 3):
            text = " ".join(words[(i * 7 + k * (turn + 3)) % len(words)] for k in range(5 + (i * turn) % 17))
            messages += [
                {"role": "user", "content": f"Q{i}.{turn}: {text}?"},
                {"role": "assistant", "content": f"{text}.\n\n{text[::-1]}"},
            ]
        rows.append({"id": f"r{i}", "messages": messages + ([Q2] if i % 5 == 4 else [])})
    return rows


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.system == "ok"])
def test_batched_tokenization_is_one_by_one(name, monkeypatch):
    """tokenize_conversations encodes many conversations' texts in one call (chunks across conversations):
    ids, masks and order are those of one encode per text, with truncation."""
    monkeypatch.setattr(conversations_mod, "CHUNK", 4)
    tok = family_tokenizer(name)
    rows = varied_rows(11) + [{"id": k, "messages": m} for k, m in CONVERSATIONS.items()]
    samples, counts = tokenize_conversations(tok, rows, max_length=300, workers=3)
    assert [s.id for s in samples] == [r["id"] for r in rows] and counts["dropped"] == 0
    assert any(s.length == 300 for s in samples) and any(s.length < 300 for s in samples)
    for sample, row in zip(samples, rows):
        ids, mask = one_by_one(tok, row["messages"], 300)
        assert sample.input_ids.tolist() == ids and sample.loss_mask.tolist() == [bool(m) for m in mask]
        assert sample.input_ids.dtype == torch.long and sample.loss_mask.dtype == torch.bool
        one = tokenize_conversation(tok, row["messages"], max_length=300)
        assert (one.input_ids, one.loss_mask) == (ids, mask)


def test_batched_tokenization_raises_for_a_bad_conversation(monkeypatch):
    monkeypatch.setattr(conversations_mod, "CHUNK", 2)
    rows = varied_rows(9)
    rows[7]["messages"] = [Q1, {"role": "assistant", "content": "Paris<|im_end|> and more"}]
    with pytest.raises(EaglekitError, match="not found verbatim"):
        tokenize_conversations(family_tokenizer("qwen2_5"), rows, max_length=300, workers=2)


def test_common_prefix_is_the_character_loop():
    def loop(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(0)
    for _ in range(500):
        a = "".join(rng.choice("ab☕") for _ in range(rng.randint(0, 40)))
        b = a[: rng.randint(0, len(a))] + "".join(rng.choice("ab☕") for _ in range(rng.randint(0, 5)))
        assert common_prefix(a, b) == common_prefix(b, a) == loop(a, b)
