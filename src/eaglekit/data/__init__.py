"""Prompts and the target's own answers to them: the data EAGLE-3 drafts learn from.

- `readers` / `formats`: prompt sources (ShareGPT, OpenAI messages, Alpaca, MT-bench, eaglekit
  turns, plain text, JSON/JSONL/parquet, Hugging Face datasets) turned into `Prompt`s.
- `prompts`: the prompts stage (filter, deduplicate, mix, split; atomic output folder).
- `magpie`: prompts synthesized by the target from its own pre-query template.
- `regenerate`: the generate stage (resumable shards of conversations) over a backend:
  `local_backend` (batched, on this machine, via `generators` and `batch_decoder`, eaglekit's
  continuous-batching decoder) or `openai_backend` (a server).
- `parallel`: the generate stage on several devices of one host (a worker process per device, merged).
"""

from eaglekit.data.records import Answer, Conversation, Prompt

__all__ = ["Answer", "Conversation", "Prompt"]
