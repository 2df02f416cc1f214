"""The speculative-decoding engine: drafting, verification, acceptance, at batch 1.

Entry points: `Engine` (plain and speculative decoding of one sequence), `DraftRunner` /
`OracleDrafter`, `SpecConfig`. The runtime they run on (target runners, KV caches, CUDA graphs,
sampling) is `eaglekit.runtime`; `reference.speculative_decode` is the same decoding in a few eager
lines, the engine's test reference and the doctor probe's loop. They load on first use (PEP 562),
so that importing `eaglekit.engine.options` for `--help` does not pull in torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {
    "DraftRunner": "draft_runner",
    "OracleDrafter": "draft_runner",
    "Engine": "generate",
    "Generation": "generate",
    "SpecConfig": "spec",
}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
