"""Output folders of the data stages: written whole or not at all, or appended and resumable.

- The prompts stage builds its folder with `eaglekit.artifacts.atomic_dir` beside the destination
  and renames it into place, so a reader sees the old folder, no folder, or the complete new one.
- `JsonlShards`: the generate stage appends finished conversations to numbered shards. A line is
  one `write` of a complete JSON object plus newline, flushed per batch; after a crash (SIGKILL
  included) the reopen drops a torn last line, and the ids on disk say what is already done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eaglekit.artifacts import read_manifest
from eaglekit.data.records import SPLITS, MalformedRecord, Prompt
from eaglekit.errors import EaglekitError


def write_jsonl(path: Path, rows) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_prompt_folder(
    folder: str | os.PathLike, splits: tuple[str, ...] = SPLITS
) -> tuple[dict, dict[str, list[Prompt]]]:
    """The manifest and prompts (by split) of an `eaglekit prompts` output folder."""
    folder = Path(folder)
    manifest = read_manifest(folder, stage="prompts")
    out: dict[str, list[Prompt]] = {}
    for split in splits:
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            raise EaglekitError(f"{path} is missing", hint="the prompts folder is incomplete; rebuild it")
        prompts = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                try:
                    prompts.append(Prompt.from_json(json.loads(line)))
                except (json.JSONDecodeError, MalformedRecord) as err:
                    raise EaglekitError(
                        f"{path}:{lineno}: {err}", hint="the prompts folder is corrupt; rebuild it"
                    ) from err
        counted = (manifest.get("counts") or {}).get(split)
        if isinstance(counted, int) and counted != len(prompts):  # cut or emptied after the fact
            raise EaglekitError(
                f"{path} holds {len(prompts)} prompts, the folder's manifest counted {counted}",
                hint="the prompts folder was changed after it was built; rebuild it (--overwrite)",
            )
        out[split] = prompts
    return manifest, out


class JsonlShards:
    """Append-only JSONL shards `{prefix}-00000.jsonl`, ... holding at most `shard_size` lines each.

    Args:
        folder: where the shards live.
        prefix: file name prefix ("conversations").
        shard_size: lines per shard; a full shard is never reopened for writing. None: one file
            `{prefix}.jsonl` without a size limit.
    """

    def __init__(self, folder: Path, prefix: str, shard_size: int | None):
        self.single = shard_size is None
        shard_size = 2**62 if shard_size is None else shard_size
        if shard_size < 1:
            raise EaglekitError(f"shard size {shard_size} < 1", hint="use e.g. --shard-size 10000")
        self.folder, self.prefix, self.shard_size = Path(folder), prefix, shard_size
        self.ids: set[str] = set()
        self.counts: list[int] = []
        self._file = None

    def shard_path(self, n: int) -> Path:
        if self.single:
            return self.folder / (f"{self.prefix}.jsonl" if n == 0 else f"{self.prefix}.overflow-{n}")
        return self.folder / f"{self.prefix}-{n:05d}.jsonl"

    def paths(self) -> list[Path]:
        return [self.shard_path(n) for n in range(len(self.counts))]

    def recover(self) -> list[dict]:
        """Read the shards on disk, drop a torn last line, and return the rows found.

        Raises:
            EaglekitError: an id appears twice, or a line in the middle of a shard is broken
                (that is corruption, not an interrupted write).
        """
        rows: list[dict] = []
        n = 0
        while self.shard_path(n).is_file():
            path = self.shard_path(n)
            data = path.read_bytes()
            keep = data.rfind(b"\n") + 1  # bytes after the last newline are a torn write
            if keep < len(data):
                with open(path, "r+b") as f:
                    f.truncate(keep)
                    f.flush()
                    os.fsync(f.fileno())
            lines = data[:keep].splitlines()
            for lineno, line in enumerate(lines, start=1):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise EaglekitError(
                        f"{path}:{lineno} is not valid JSON ({err.msg})",
                        hint="the shard is corrupt; delete the output folder and rerun",
                    ) from err
                if row["id"] in self.ids:
                    raise EaglekitError(
                        f"{path}:{lineno}: id {row['id']!r} appears twice",
                        hint="the output is corrupt; delete the output folder and rerun",
                    )
                self.ids.add(row["id"])
                rows.append(row)
            self.counts.append(len(lines))
            n += 1
        return rows

    def append(self, rows: list[dict]) -> None:
        """Append complete rows and flush them to disk (one write per line)."""
        for row in rows:
            if row["id"] in self.ids:
                raise EaglekitError(f"internal error: id {row['id']!r} written twice", hint="please report this")
            if self._file is None or self.counts[-1] >= self.shard_size:
                self._open_next()
            self._file.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
            self.ids.add(row["id"])
            self.counts[-1] += 1
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        if not self.counts or self.counts[-1] >= self.shard_size:
            self.counts.append(0)
        # Unbuffered binary append: each `write` of a line is one system call.
        self._file = open(self.shard_path(len(self.counts) - 1), "ab", buffering=0)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
