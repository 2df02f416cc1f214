"""The speculative-decoding engine: target runners, draft runners, trees, verification, batching.

Entry points: `Engine` (plain and speculative decoding at batch 1), `generate_batch` (plain batched
generation for data), `make_target_runner`, `DraftRunner` / `OracleDrafter`, `SpecConfig`, `Sampling`.
"""

from eaglekit.engine.batch import Completion, generate_batch
from eaglekit.engine.draft_runner import DraftRunner, OracleDrafter
from eaglekit.engine.generate import Engine, Generation
from eaglekit.engine.runner import make_target_runner
from eaglekit.engine.sampling import Sampling
from eaglekit.engine.spec import SpecConfig

__all__ = ["Completion", "DraftRunner", "Engine", "Generation", "OracleDrafter", "Sampling", "SpecConfig",
           "generate_batch", "make_target_runner"]
