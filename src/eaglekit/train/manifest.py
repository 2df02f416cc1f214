"""Reading a training run's manifest (what `Trainer.write_manifest` writes), for the stages and the
pipeline that read it: one place for its layout. No torch here (`eaglekit run --plan` stays light)."""

from __future__ import annotations

from pathlib import Path

from eaglekit.artifacts import MANIFEST, read_json


def draft_manifest_path(folder: str | Path) -> Path:
    return Path(folder) / MANIFEST


def read_draft_manifest(folder: str | Path, what: str = "draft manifest") -> dict | None:
    """The manifest of a training run folder, None when it has none yet."""
    path = draft_manifest_path(folder)
    return read_json(path, what) if path.is_file() else None


def steps_done(manifest: dict | None) -> int | None:
    """The optimizer steps the run had done when it wrote the manifest."""
    return ((manifest or {}).get("steps") or {}).get("done")


def predicted_accept_length(manifest: dict | None, k: int | None = None) -> float | None:
    """The accept length training predicts for a served chain of `k` drafts: the walk (greedy chain
    decoding replayed over the validation answers) capped at k, `walk_accept_length_by_k[k-1]`; None
    where the run did not unroll k steps (a walk of 7 is not a prediction for a chain of 5: it commits
    more a cycle). k None: the walk at the depth validation unrolled."""
    best = (manifest or {}).get("best") or {}
    if k is None:
        return best.get("walk_accept_length")
    by_k = best.get("walk_accept_length_by_k") or []
    return by_k[k - 1] if 1 <= k <= len(by_k) else None


def validation_label(manifest: dict | None) -> str:
    """What training validated on, in a few words (the workload its prediction is for): its
    `counts.validation` (train/sources.py `validation_workload`), else "held-out conversations"."""
    workload = ((manifest or {}).get("counts") or {}).get("validation") or {}
    return workload.get("label") or "held-out conversations"


def validated_steps(manifest: dict | None) -> int | None:
    """The draft steps training's validation unrolled (`--val-ttt-steps`, else `--ttt-steps`): the
    longest served chain its walk predicts."""
    config = (manifest or {}).get("config") or {}
    return config.get("val_ttt_steps") or config.get("ttt_steps")


def prediction_text(manifest: dict | None, k: int | None = None) -> str:
    """ "predicted accept length X for a chain of k on <workload>": training's prediction, said with the
    chain length and the workload it holds for. k: the served chain's (a bench or probe of k drafts);
    where the run did not unroll k steps, or k is None, the walk at the depth validation unrolled
    (`--val-ttt-steps`, else `ttt_steps`), named so."""
    steps = validated_steps(manifest)
    walk = predicted_accept_length(manifest, k)
    if walk is None or k is None:
        walk, k = predicted_accept_length(manifest), steps
    value = "none" if walk is None else f"{walk:.3f}"
    return f"predicted accept length {value} for a chain of {k} on {validation_label(manifest)}"
