"""What runs a target fast, shared by the speculative engine and the generate stage's batch decoder.

Static KV caches and attention masks (`kv`), FlexAttention over a row's cache blocks (`flex`),
fixed-shape steps compiled and captured in CUDA graphs (`graphs`), greedy and sampled token choice
(`sampling`), and the target runners (`runner`: FAST, a lean Llama-family decoder with its kernel
choice, in `target_fast`; GENERIC, the HF model with a cache the engine controls, in `target_hf`).
`make_target_runner` and `Sampling` load on first use (PEP 562), so `--help` does not pull in torch.
"""

from eaglekit.lazy import lazy_exports

_HOMES = {"make_target_runner": "runner", "Sampling": "sampling"}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
