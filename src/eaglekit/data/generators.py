"""Token-level batched generation with the target, behind one small interface.

`TokenGenerator.generate(prompts, max_new_tokens)` takes token-id prompts of any lengths and
returns, per prompt, the new token ids (up to and including the first stop token) and why they
ended. Two implementations:

- `HFGenerator`: Hugging Face `generate`, batched with left padding: what a user would otherwise
  run, kept as `--backend hf` so the benchmark can compare against it.
- `EngineGenerator`: eaglekit's own static-KV-cache batch generator (`eaglekit.engine.batch`),
  the fast path on GPU.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import asdict, dataclass

import torch

from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; temperature 0 means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise EaglekitError(f"bad sampling settings {asdict(self)}",
                                hint="temperature >= 0, 0 < top_p <= 1, top_k >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    token_ids: list[int]  # new tokens, the stop token included when finish_reason == "stop"
    finish_reason: str  # "stop" or "length"


def cut_at_stop(tokens: list[int], stop_ids: set[int], max_new_tokens: int) -> Completion:
    """The generated tokens up to the first stop token (kept), and the finish reason."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return Completion(tokens[: i + 1], "stop")
    return Completion(tokens[:max_new_tokens], "length")


class HFGenerator:
    """Batched Hugging Face `generate` with left padding.

    Args:
        model: the target (an `AutoModelForCausalLM`).
        stop_ids: token ids that end a turn.
        sampling: sampling settings.
    """

    name = "hf"

    def __init__(self, model, stop_ids: list[int], sampling: Sampling):
        if not stop_ids:
            raise EaglekitError("the target has no stop token", hint="set eos_token_id in generation_config.json")
        self.model, self.stop_ids, self.sampling = model, list(stop_ids), sampling
        self.pad_id = self.stop_ids[0]
        torch.manual_seed(sampling.seed)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Completion]:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        # Left padding: every row's last prompt token sits in the same column, where decoding starts.
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, P]
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P]
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention_mask[row, width - len(ids):] = 1
        s = self.sampling
        kwargs = dict(do_sample=False) if s.greedy else dict(
            do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
            **kwargs)  # [B, P + T]
        new = out[:, width:].tolist()
        stops = set(self.stop_ids)
        return [cut_at_stop(row, stops, max_new_tokens) for row in new]


def engine_available() -> bool:
    """Whether eaglekit's own batch generator exists in this installation."""
    try:
        return importlib.util.find_spec("eaglekit.engine.batch") is not None
    except ModuleNotFoundError:
        return False


class EngineGenerator:
    """eaglekit's static-KV-cache batch generator (`eaglekit.engine.batch.generate_batch`)."""

    name = "engine"

    def __init__(self, model, stop_ids: list[int], sampling: Sampling):
        if not engine_available():
            raise EaglekitError("eaglekit's batch generator (eaglekit.engine.batch) is not installed",
                                hint="use --backend hf")
        from eaglekit.engine import batch

        self._generate_batch = batch.generate_batch
        self.model, self.stop_ids, self.sampling = model, list(stop_ids), sampling
        torch.manual_seed(sampling.seed)

    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Completion]:
        s = self.sampling
        rows = self._generate_batch(self.model, prompts, max_new_tokens=max_new_tokens,
                                    stop_token_ids=self.stop_ids, temperature=s.temperature,
                                    top_p=s.top_p, top_k=s.top_k)
        stops = set(self.stop_ids)
        return [cut_at_stop(list(row), stops, max_new_tokens) for row in rows]


def make_generator(backend: str, model, stop_ids: list[int], sampling: Sampling):
    """`local` is the engine's generator when installed, else HF generate (said in the log)."""
    if backend == "local":
        backend = "engine" if engine_available() else "hf"
        if backend == "hf":
            log.info("eaglekit.engine.batch is not available: the local backend uses HF generate")
    if backend == "engine":
        return EngineGenerator(model, stop_ids, sampling)
    if backend == "hf":
        return HFGenerator(model, stop_ids, sampling)
    raise EaglekitError(f"unknown local backend {backend!r}", hint="use local, engine or hf")
