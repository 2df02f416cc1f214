"""Run folders, manifests, fingerprints and atomic writes: the contract between stages.

Every stage writes one folder holding its outputs and a `manifest.json` with the resolved config,
the fingerprints of the target it was made for, the input fingerprints and counts. A later stage
reads the manifest and refuses an input made for another target or tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from eaglekit import __version__
from eaglekit.errors import EaglekitError

MANIFEST = "manifest.json"
# Aux layer ids inside eaglekit always mean "output of 0-based decoder layer i" (pre final norm).
AUX_CONVENTION = "output_of_layer_0based"


def sha256_json(obj: Any) -> str:
    """Stable hash of a JSON-serialisable object (sorted keys, no whitespace)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    A reader never sees a half-written file, and a crash leaves the old file (or none) in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o644)  # mkstemp creates 0600
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(out: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder; move it to `out` only if the block succeeds."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise EaglekitError(f"output folder {out} already exists", hint="pass --overwrite or another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if out.exists():
            # Two renames: the old folder is never deleted before the new one is in place.
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise EaglekitError(f"{what} not found: {path}", hint="check the path")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise EaglekitError(
            f"{what} {path} is not valid JSON ({err.msg} at line {err.lineno})",
            hint="the file is corrupt or truncated; regenerate it",
        ) from err


def write_manifest(out_dir: str | os.PathLike, *, stage: str, config: dict, target: dict | None,
                   inputs: dict | None = None, counts: dict | None = None,
                   extra: dict | None = None) -> dict:
    """Write `out_dir/manifest.json` and return it.

    Args:
        out_dir: the stage's output folder.
        stage: stage name ("target", "generate", "features", "train", ...).
        config: the resolved configuration of the stage.
        target: the target fingerprint (see `eaglekit.target.fingerprint`), or None.
        inputs: fingerprints of the input artifacts, by name.
        counts: sizes worth reporting (prompts, tokens, shards ...).
        extra: anything else the stage wants to record (metrics ...).
    """
    manifest = {
        "stage": stage,
        "eaglekit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "aux_layer_convention": AUX_CONVENTION,
        "config": config,
        "target": target,
        "inputs": inputs or {},
        "counts": counts or {},
    }
    if extra:
        manifest.update(extra)
    write_json(Path(out_dir) / MANIFEST, manifest)
    return manifest


def read_manifest(folder: str | os.PathLike, *, stage: str | None = None) -> dict:
    """Read `folder/manifest.json`; with `stage`, refuse a folder written by another stage."""
    folder = Path(folder)
    if not folder.exists():
        raise EaglekitError(f"no such folder: {folder}", hint="check the path")
    manifest = read_json(folder / MANIFEST, what="manifest")
    if stage is not None and manifest.get("stage") != stage:
        raise EaglekitError(
            f"{folder} holds a '{manifest.get('stage')}' artifact, expected '{stage}'",
            hint=f"pass the output folder of `eaglekit {stage}`",
        )
    return manifest


def check_same_target(expected: dict, found: dict | None, *, what: str) -> None:
    """Refuse an artifact made for another target model or another tokenizer / chat template."""
    if found is None:
        raise EaglekitError(f"{what} records no target fingerprint", hint="regenerate it with eaglekit")
    for key, label in (("config_hash", "target model config"),
                       ("tokenizer_hash", "tokenizer and chat template")):
        if expected.get(key) != found.get(key):
            raise EaglekitError(
                f"{what} was made for another {label}: {found.get(key)} != {expected.get(key)} "
                f"(made for {found.get('name')!r}, now {expected.get('name')!r})",
                hint="regenerate it with this target, or pass the target it was made for",
            )
