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
