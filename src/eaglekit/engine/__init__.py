"""The speculative-decoding engine: target runners, draft runners, trees, verification, batching.

Entry points: `Engine` (plain and speculative decoding at batch 1), `generate_batch` (plain batched
generation for data), `make_target_runner`, `DraftRunner` / `OracleDrafter`, `SpecConfig`, `Sampling`.
They load on first use (PEP 562), so that importing `eaglekit.engine.options` for `--help` does not
pull in torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {
    "Completion": "batch", "generate_batch": "batch",
    "DraftRunner": "draft_runner", "OracleDrafter": "draft_runner",
    "Engine": "generate", "Generation": "generate",
    "make_target_runner": "runner",
    "Sampling": "sampling",
    "SpecConfig": "spec",
}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
