"""eaglekit's aux layer id convention: id i is the output of 0-based decoder layer i (before the final norm).

Every manifest, checkpoint and option holds ids in this convention; each format converts them at its
own edge (`formats/sglang.py`, `formats/vllm.py`, `formats/eagle.py`). No torch here: the formats'
registry, which the options read, uses it.
"""

from __future__ import annotations

from eaglekit.errors import EaglekitError


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high layers as outputs of 0-based layers: [1, N//2-1, N-4]."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if len(set(ids)) != 3 or min(ids) < 0:
        raise EaglekitError(
            f"a target with {num_layers} layers has no distinct default aux layers ({ids})",
            hint="pass aux_layer_ids explicitly, e.g. --aux-layer-ids 0,1,2",
        )
    return ids


def check_aux_layer_ids(aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """Validate ids in eaglekit's convention (output of 0-based layer i)."""
    ids = [int(i) for i in aux_layer_ids]
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise EaglekitError(
            f"aux layer ids {bad} are outside the target's layers (expected 0..{num_layers - 1}, "
            f"the output of 0-based decoder layer i)",
            hint=f"the default is {default_aux_layer_ids(num_layers)}",
        )
    if len(set(ids)) != len(ids):
        raise EaglekitError(f"aux layer ids {ids} repeat a layer", hint="give distinct layers")
    return ids
