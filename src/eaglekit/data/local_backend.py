"""Answer conversations with the target itself, on this machine, turn by turn.

With the engine (a generator that streams, `continuous`), scheduling is continuous: the engine
keeps `batch_size` rows busy and asks for the next turn whenever a row frees up; a multi-turn
conversation goes to the front of the queue as soon as its answer is back, so its next user turn
follows the target's own answer and it finishes soon after it started. With HF `generate`
scheduling is static batching over turns, as a user of HF would run it: a batch holds the next
turn of up to `batch_size` conversations, new prompts are taken in windows sorted by length so a
batch pads little, and a multi-turn conversation goes back to the front after each answer.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

from eaglekit.data.batch_decoder import Request
from eaglekit.data.quality import loop_tail
from eaglekit.data.records import Answer, Conversation
from eaglekit.errors import EaglekitError
from eaglekit.targets.chat import prompt_ids

SORT_WINDOW = 8  # batches' worth of new prompts sorted by length together


def context_length(given: int | None, config) -> int:
    """Prompt + answer tokens a conversation may reach: --context-length, else the target's own."""
    context = given or getattr(config, "max_position_embeddings", None)
    if not context:
        raise EaglekitError("the target's config gives no context length", hint="pass --context-length")
    return context


class LocalBackend:
    """Chat-level backend over a token-level generator (`eaglekit.data.generators`).

    Args:
        tokenizer: the target's tokenizer (renders prompts with its chat template).
        generator: a `TokenGenerator` (HF generate or the engine's batch generator).
        max_new_tokens: answer length limit per turn.
        batch_size: conversations per generation call.
        context_length: prompt + answer tokens the target can attend to.
        template_kwargs: passed to the chat template (e.g. enable_thinking=False).
    """

    def __init__(
        self,
        tokenizer,
        generator,
        *,
        max_new_tokens: int,
        batch_size: int,
        context_length: int,
        template_kwargs: dict | None = None,
    ):
        if batch_size < 1 or max_new_tokens < 1:
            raise EaglekitError("batch size and max new tokens must be >= 1", hint="e.g. --batch-size 64")
        self.tokenizer, self.generator = tokenizer, generator
        self.max_new_tokens, self.batch_size, self.context_length = max_new_tokens, batch_size, context_length
        self.template_kwargs = template_kwargs or {}
        self.name = generator.name

    def run_stats(self) -> dict | None:
        """The generator's own account of the run (the engine's time split), if it keeps one."""
        stats = getattr(self.generator, "run_stats", None)
        return stats() if stats is not None else None

    def run(self, conversations: Iterable[Conversation]) -> Iterator[list[Conversation]]:
        """Yield lists of finished conversations (answered, or skipped when the context is full)."""
        if getattr(self.generator, "continuous", False):
            return self._run_continuous(conversations)
        return self._run_static(conversations)

    def _run_continuous(self, conversations: Iterable[Conversation]) -> Iterator[list[Conversation]]:
        """Stream turns to the engine; a conversation's next turn is queued when its answer is back."""
        source = iter(conversations)
        next_turns: deque[Conversation] = deque()
        finished: list[Conversation] = []

        def take() -> Request | None:
            while (conv := next_turns.popleft() if next_turns else next(source, None)) is not None:
                ids = self._ids(conv)
                budget = self._budget(conv, ids)
                if budget:
                    last = len(conv.answers) + 1 == len(conv.prompt.turns)
                    return Request(
                        ids, budget, key=conv, session=id(conv), session_ends=last
                    )  # the next turn resumes its row
                finished.append(conv)  # skipped: no room left in the context
            return None

        for request, completion in self.generator.serve(take):
            conv = request.key
            self._record(conv, request.ids, completion)
            (next_turns if not conv.done else finished).append(conv)
            if len(finished) >= self.batch_size:
                yield finished
                finished = []
        if finished:
            yield finished

    def _run_static(self, conversations: Iterable[Conversation]) -> Iterator[list[Conversation]]:
        source = iter(conversations)
        queue: deque[tuple[Conversation, list[int]]] = deque()
        exhausted = False
        while True:
            if len(queue) < self.batch_size and not exhausted:
                window = []
                for conv in source:
                    window.append((conv, self._ids(conv)))
                    if len(window) >= self.batch_size * SORT_WINDOW:
                        break
                else:
                    exhausted = True
                window.sort(key=lambda item: len(item[1]))
                queue.extend(window)
            if not queue:
                return
            batch = [queue.popleft() for _ in range(min(self.batch_size, len(queue)))]
            finished = []
            for conv, more in self._answer(batch):
                if more:
                    queue.appendleft((conv, self._ids(conv)))
                else:
                    finished.append(conv)
            if finished:
                yield finished

    def _ids(self, conv: Conversation) -> list[int]:
        return prompt_ids(self.tokenizer, conv.next_messages(), **self.template_kwargs)

    def _budget(self, conv: Conversation, ids: list[int]) -> int:
        """New tokens this turn may have; 0 (and the conversation marked skipped) when none fit."""
        budget = min(self.max_new_tokens, self.context_length - len(ids))
        if budget < 1:
            conv.skipped = f"prompt of {len(ids)} tokens leaves no room in the context of {self.context_length}"
            return 0
        return budget

    def _record(self, conv: Conversation, ids: list[int], completion) -> None:
        tokens = completion.token_ids
        body = tokens[:-1] if completion.finish_reason == "stop" else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        loops = (
            loop_tail(tokens) if completion.finish_reason in ("length", "loop") else 0
        )  # a loop runs until it is cut
        conv.answers.append(
            Answer(
                text=text,
                finish_reason=completion.finish_reason,
                num_tokens=len(tokens),
                counted_by="generator",
                prompt_tokens=len(ids),
                loop_tokens=loops,
            )
        )

    def _answer(self, batch: list[tuple[Conversation, list[int]]]) -> list[tuple[Conversation, bool]]:
        """Generate the next turn of each conversation; True where more turns remain."""
        results: list[tuple[Conversation, bool]] = []
        full: list[tuple[Conversation, list[int]]] = []
        short: list[tuple[Conversation, list[int], int]] = []
        for conv, ids in batch:
            budget = self._budget(conv, ids)
            if not budget:
                results.append((conv, False))
            elif budget == self.max_new_tokens:
                full.append((conv, ids))
            else:
                short.append((conv, ids, budget))
        calls = [(full, self.max_new_tokens)] if full else []
        if short:  # rows near the context end share one call with the smallest room left
            calls.append(([(c, i) for c, i, _ in short], min(b for _, _, b in short)))
        for rows, budget in calls:
            completions = self.generator.generate([ids for _, ids in rows], budget)
            for (conv, ids), completion in zip(rows, completions):
                self._record(conv, ids, completion)
                results.append((conv, not conv.done))
        return results
