"""Loops at the end of answers: found exactly, counted per answer, summed in the manifest."""

import random

from eaglekit.data.quality import loop_tail
from eaglekit.data.records import Answer, Conversation, Prompt


def test_loop_tail_finds_repeated_blocks_at_the_end_only():
    assert loop_tail([1, 2, 3, 4, 5, 6, 7, 8]) == 0
    assert loop_tail([9, 8, 7] + [1, 2, 3] * 5) == 15  # the block's first occurrence counts
    assert loop_tail([9, 8, 7] + [1, 2, 3] * 2) == 0  # twice is not yet a loop
    assert loop_tail([5] * 10) == 10
    assert loop_tail([4] + [1, 2] * 3) == 6
    assert loop_tail([1, 2] * 3 + [3]) == 0  # the answer left the loop
    assert loop_tail([7, 7, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]) == 10  # a loop cut mid-block
    rng = random.Random(0)
    block = [rng.randrange(1000) for _ in range(40)]
    assert loop_tail([1, 2, 3] + block * 3) == 120
    assert loop_tail([1, 2, 3] + block * 3, max_period=32) == 0  # a block longer than looked for


def test_loop_tokens_travel_with_the_answer_and_only_when_measured():
    prompt = Prompt(id="p", source="s", turns=["a", "b"])
    conv = Conversation(
        prompt,
        "train",
        answers=[Answer("x", "length", 16, "generator", loop_tokens=12), Answer("y", "stop", 3, "server")],
    )
    turns = conv.to_json()["meta"]["turns"]
    assert turns[0]["loop_tokens"] == 12 and "loop_tokens" not in turns[1]
