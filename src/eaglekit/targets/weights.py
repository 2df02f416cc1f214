"""A fingerprint of a target's weights that costs milliseconds, not a read of every byte.

Two targets with one config and tokenizer (a model and its fine-tune) differ only in their
weights, so data and drafts made for one must not pass as made for the other. Hashing every byte
of a multi-GB model on each command would cost minutes; file sizes and times say nothing about
content. So a deterministic sample is hashed:

- safetensors: every tensor's name, dtype and shape, and 4 KiB at its start, middle and end (the
  whole tensor when it is smaller): any tensor a fine-tune touched differs in all three places;
- GGUF: the file size and 4 KiB at evenly spaced offsets (one per MiB, 1024 to 4096 of them).

A folder written by `eaglekit target prepare` records the fingerprint of the target it was made
from and the sample hash of its own files; while its files still hash to that, it answers with
the source's fingerprint, so a GGUF and its prepared folder are one target.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from eaglekit.artifacts import MANIFEST
from eaglekit.targets.source import TargetSource, validate_safetensors

CHUNK = 4096
GGUF_CHUNKS = (1024, 4096)  # fewest and most samples of a GGUF file


def weights_fingerprint(source: TargetSource) -> str:
    """The weights' sample hash; for a prepared folder whose files are unchanged, its source's."""
    if source.kind == "gguf":
        return _cached(str(source.path), "gguf", *_stamp(source.path))
    own = hf_dir_weights_hash(source.path)
    recorded = prepared_from(source.path)
    if recorded is not None and recorded["files_hash"] == own:
        return recorded["weights_hash"]
    return own


def hf_dir_weights_hash(folder: Path) -> str:
    files = sorted(folder.glob("*.safetensors"))
    return _cached(str(folder), "safetensors", *(s for f in files for s in (f.name, *_stamp(f))))


def prepared_from(folder: Path) -> dict | None:
    """What `eaglekit target prepare` recorded in `folder`: the source's weights hash and the files' own."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not ours to judge: the folder is read as plain weights
    weights = (manifest.get("target") or {}).get("weights_hash")
    files = manifest.get("weights_files_hash")
    if manifest.get("stage") != "target" or not weights or not files:
        return None
    return {"weights_hash": weights, "files_hash": files}


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@lru_cache(maxsize=16)
def _cached(path: str, kind: str, *stamp) -> str:
    """Hash once per process and file state (size and mtime are the cache key, never the hash)."""
    return _gguf_hash(Path(path)) if kind == "gguf" else _safetensors_hash(Path(path))


def _safetensors_hash(folder: Path) -> str:
    h = hashlib.sha256()
    entries = []
    for file in sorted(folder.glob("*.safetensors")):
        header = validate_safetensors(file)
        data_start = 8 + _header_length(file)
        entries += [(name, file, data_start, info) for name, info in header.items() if name != "__metadata__"]
    for name, file, data_start, info in sorted(entries, key=lambda e: e[0]):  # shard layout does not matter
        begin, end = info["data_offsets"]
        h.update(json.dumps([name, info["dtype"], info["shape"]]).encode())
        with open(file, "rb") as f:
            for offset in _sample_offsets(end - begin):
                f.seek(data_start + begin + offset)
                h.update(f.read(min(CHUNK, end - begin - offset)))
    return h.hexdigest()[:16]


def _header_length(file: Path) -> int:
    with open(file, "rb") as f:
        return int.from_bytes(f.read(8), "little")


def _sample_offsets(size: int) -> list[int]:
    """Start, middle and end chunk of a tensor of `size` bytes (every chunk when it is small)."""
    if size <= 3 * CHUNK:
        return list(range(0, size, CHUNK))
    return [0, (size // 2) - CHUNK // 2, size - CHUNK]


def _gguf_hash(path: Path) -> str:
    size = path.stat().st_size
    count = min(max(size >> 20, GGUF_CHUNKS[0]), GGUF_CHUNKS[1])
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= count * CHUNK:
            h.update(f.read())
        else:
            step = (size - CHUNK) // (count - 1)
            for i in range(count):
                f.seek(i * step)
                h.update(f.read(CHUNK))
    return h.hexdigest()[:16]
