"""Run folders, manifests, fingerprints and atomic writes: the contract between stages.

Every stage writes one folder holding its outputs and a `manifest.json` with the resolved config,
the fingerprints of the target it was made for, the input fingerprints and counts. A later stage
reads the manifest and refuses an input made for another target, tokenizer or weights.

One rule keeps two runs from mixing and an unfinished folder from passing as finished:

- a writer holds the folder's writer lock (`writer_lock`) from before its first change to the
  folder (an `--overwrite` deletion included) until its manifest is written;
- the manifest is written last and atomically: a folder without one, or whose manifest says
  `complete: false` (training that stopped early), is unfinished;
- readers go through `read_manifest` / `require_finished`, which say what to run for an
  unfinished folder and refuse it unless the user asked for it (`--allow-unfinished`).

And one rule keeps a user's files safe: a stage writes into a folder only if it is empty (or
missing) or that same stage made it (`check_owner`), `--overwrite` included; what an
`--overwrite` replaces is moved aside (`.NAME.old-PID` beside the folder) and deleted only once
the new result is complete. A writer that fails puts it back; one that was killed leaves it for the
next writer of the folder, which puts it back or, where the new result was complete, deletes it
(`settle_replace`), as it deletes the temporary folders (`.NAME.PID-*.tmp`) a killed writer left.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from eaglekit import __version__
from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# The files stages write and other stages (the pipeline, the report) read, named once.
TRAIN_LOG = "log.jsonl"  # eaglekit train: one JSON event a line (train/tracker.py)
DOCTOR_REPORT = "report.json"  # eaglekit doctor --out
BENCH_RESULTS = "results.json"  # eaglekit bench --out
PIPELINE_STATE = "pipeline.json"  # eaglekit run: which stages finished, with their commands
SCALING_SUMMARY = "scaling.json"  # eaglekit run with `scaling`: the curve's table
TRAINER_STATE = "trainer_state"  # a training run folder's resume state (train/state.py); the pipeline resumes on it
# The folders of a run (`eaglekit run --out RUN`) that more than the pipeline reads: the report, the
# scaling curve and the run's summary.
RUN_DRAFT = "draft"  # eaglekit train --out
RUN_EXPORT = "export"  # one folder per format under it
RUN_DOCTOR = "doctor"
RUN_BENCH = "bench"
RUN_SCALING = "scaling"  # one slice run per fraction under it, and SCALING_SUMMARY
CONVERSATION_SHARDS = "conversations"  # a generate folder's shards: conversations-00000.jsonl, ...
# Aux layer ids inside eaglekit always mean "output of 0-based decoder layer i" (pre final norm).
AUX_CONVENTION = "output_of_layer_0based"


def sha256_json(obj: Any) -> str:
    """Stable hash of a JSON-serialisable object (sorted keys, no whitespace)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def hash_share(key: str, fraction: float) -> bool:
    """Whether `key` falls in the hash-stable share `fraction` of all keys: the same answer on every
    rerun and in every mix, and a smaller share inside a larger one. Callers salt the key so that
    their shares (the prompts' split, the samples' split, the training share) are independent."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


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


# A reader probing a lock holds it for microseconds; a writer that meets one waits that long.
LOCK_WAIT_S = 0.5


def _try_flock(fd: int, kind: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def _writer_name(stage: str | None) -> str:
    return f"`eaglekit {stage}`" if stage else "eaglekit process"


@contextmanager
def writer_lock(folder: str | os.PathLike, *, stage: str | None = None) -> Iterator[Path]:
    """Hold `folder` (created if missing) as its only writer; refuse while another process holds it.

    The lock is an flock on the folder itself, so the kernel releases it when the writer dies, even
    by SIGKILL. Take it before the first change to the folder, an `--overwrite` deletion included:
    deleting first would pull the folder from under a run still writing there.
    """
    folder = Path(folder)
    if folder.is_symlink() and not folder.is_dir() or folder.exists() and not folder.is_dir():
        raise EaglekitError(f"{folder} is a file (or a broken link), not a folder", hint="pass another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError as err:  # a read-only mount, no permission, a link loop
        raise EaglekitError(
            f"cannot make or open the folder {folder}: {err.strerror or err}",
            hint="pass an --out in a folder you can write to",
        ) from None
    try:
        if not _try_flock(fd, fcntl.LOCK_EX, LOCK_WAIT_S):
            raise EaglekitError(
                f"another {_writer_name(stage)} is writing to {folder}",
                hint="wait for it to finish, or use another --out",
            )
        settle_replace(folder)
        if stage is not None:
            check_owner(folder, stage)
        _ASIDE.pop(folder.resolve(), None)
        try:
            yield folder
        except BaseException:
            _put_back(folder)  # a failed or interrupted writer changes nothing: the replaced result returns
            raise
        _finish_replace(folder)
    finally:
        os.close(fd)  # closing releases the lock


# A writer's lock name where it differs from the stage its manifest records.
_MANIFEST_STAGE = {"target prepare": "target"}
# What an unfinished folder of a stage that writes in place holds before its manifest (a killed
# generate's run file, a train killed before its first manifest, a run's state): that stage's own.
_UNFINISHED_MARKS = {
    "generate": ("run.json",),
    "train": (TRAINER_STATE, TRAIN_LOG),
    "run": (PIPELINE_STATE,),
    "doctor": (DOCTOR_REPORT,),
    "vocab": ("vocab.safetensors",),
}


def check_owner(folder: str | os.PathLike, stage: str) -> None:
    """Refuse a folder that holds anything `stage` did not make, `--overwrite` or not: it writes only
    into a missing or empty folder, or one whose manifest (or, unfinished, whose own state file)
    says that stage made it. eaglekit never deletes or mixes into what it did not write."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise EaglekitError(f"{folder} is a file, not a folder", hint="pass another --out")
    if not has_content(folder):
        return
    want = _MANIFEST_STAGE.get(stage, stage)
    try:
        found = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("stage")
    except FileNotFoundError:
        found = None
    except (OSError, ValueError, AttributeError):
        found = "?"
    if found == want or (found is None and any((folder / m).exists() for m in _UNFINISHED_MARKS.get(want, ()))):
        return
    if isinstance(found, str) and found != "?":
        raise EaglekitError(
            f"{folder} holds the output of `eaglekit {found}`, not of {_writer_name(stage)}",
            hint="pass another --out; writing here would replace that stage's manifest",
        )
    names = sorted(p.name for p in folder.iterdir())
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise EaglekitError(
        f"{folder} holds files {_writer_name(stage)} did not write ({shown}); eaglekit never "
        "deletes or writes into a folder it did not make, --overwrite included",
        hint="move those files elsewhere, or pass another --out",
    )


# ---- replacing a folder: the old result goes only once the new one is complete -------------------

# folder (resolved) -> the sibling holding what this process's `clear_folder` moved aside
_ASIDE: dict[Path, Path] = {}


def _aside_name(folder: Path, pid: int) -> Path:
    return folder.with_name(f".{folder.name}.old-{pid}")


def _leftovers(folder: Path) -> tuple[list[Path], list[Path]]:
    """The moved-aside old results and the temporary folders of dead writers of `folder`: named
    `.NAME.old-PID` and `.NAME.PID-XXXXXXXX.tmp` (`.NAME.XXXXXXXX.tmp` before the pid was in it)."""
    parent = folder.parent
    if not parent.is_dir():
        return [], []
    name = re.escape(folder.name)
    old_name = re.compile(rf"\.{name}\.old-(\d+)")
    tmp_name = re.compile(rf"\.{name}\.(?:(\d+)-)?[a-z0-9_]{{8}}\.tmp")
    olds, tmps = [], []
    for path in parent.iterdir():
        for pattern, found in ((old_name, olds), (tmp_name, tmps)):
            match = pattern.fullmatch(path.name)
            if match and path.is_dir() and not _alive(int(match[1]) if match[1] else None):
                found.append(path)
    return sorted(olds, key=lambda p: p.stat().st_mtime), tmps


def _alive(pid: int | None) -> bool:
    """Whether process `pid` runs (this one included: its own writers clean up after themselves)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def finished_here(folder: Path) -> bool:
    """Whether `folder` holds a finished result: a manifest that does not say `complete: false`."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("complete") is not False


def _empty(folder: Path) -> None:
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _move_children(src: Path, dst: Path) -> None:
    """Every entry of `src` into `dst` (renames; the manifest last, so `dst` reads as finished only when whole)."""
    children = sorted(src.iterdir(), key=lambda p: p.name == MANIFEST)
    for child in children:
        os.replace(child, dst / child.name)


def settle_replace(folder: str | os.PathLike) -> None:
    """Finish what a killed writer of `folder` left beside it (the caller holds the folder's lock):
    the old result it moved aside comes back unless the new one in `folder` is complete (then it
    is deleted), and its temporary folders go. Nothing hidden outlives the run that meets it."""
    folder = Path(folder)
    olds, tmps = _leftovers(folder)
    for tmp in tmps:
        log.warning("deleting %s, the unfinished output of a killed writer of %s", tmp, folder)
        shutil.rmtree(tmp, ignore_errors=True)
    if not olds:
        return
    keep = olds[-1]  # the newest replaced result
    if folder.is_dir() and finished_here(folder):
        log.warning("%s holds a complete new result: deleting the replaced one a killed writer left (%s)", folder, keep)
    else:
        log.warning(
            "putting back %s: the writer that was replacing it was killed before its new result was complete", folder
        )
        folder.mkdir(parents=True, exist_ok=True)
        _empty(folder)
        _move_children(keep, folder)
    for old in olds:
        shutil.rmtree(old, ignore_errors=True)


def settle_folder(folder: str | os.PathLike, stage: str) -> None:
    """Before a run reaches the stage that writes `folder`: refuse it now if `stage` may not write
    there (`check_owner`), and finish what a killed writer left beside it (`settle_replace`), so no
    hidden folder outlives the run even where the stage is skipped. Makes no folder."""
    folder = Path(folder)
    olds, tmps = _leftovers(folder)
    if not folder.exists() and not olds and not tmps:
        return
    created = not folder.exists()
    with writer_lock(folder, stage=stage):
        if created and not has_content(folder):
            folder.rmdir()


def _put_back(folder: Path) -> None:
    """A writer failed: what its `clear_folder` moved aside replaces whatever it wrote since."""
    aside = _ASIDE.pop(folder.resolve(), None)
    if aside is None or not aside.is_dir():
        return
    log.warning("%s: the run failed, so the result it was replacing is put back", folder)
    _empty(folder)
    _move_children(aside, folder)
    aside.rmdir()


def _finish_replace(folder: Path) -> None:
    """A writer ended normally: the replaced result goes once the new one is complete, else it returns."""
    aside = _ASIDE.get(folder.resolve())
    if aside is None:
        return
    if finished_here(folder):
        _ASIDE.pop(folder.resolve())
        shutil.rmtree(aside, ignore_errors=True)
    else:
        _put_back(folder)


def made_before(result: str | os.PathLike, source: str | os.PathLike) -> bool:
    """Whether a result file (a bench's, a doctor's) predates the file it measured (a draft's
    manifest): a run that trained again but did not bench again still held the old bench."""
    result, source = Path(result), Path(source)
    return result.is_file() and source.is_file() and result.stat().st_mtime < source.stat().st_mtime


def being_written(folder: str | os.PathLike) -> bool:
    """Whether some process holds `folder`'s writer lock right now."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:
        return not _try_flock(fd, fcntl.LOCK_SH, 0.0)
    finally:
        os.close(fd)


def clear_folder(folder: str | os.PathLike) -> None:
    """Empty a folder whose writer lock (`writer_lock`) the caller holds, for `--overwrite`: its
    contents move aside (`.NAME.old-PID` beside it) and are deleted only when the writer ends with
    a complete result; a writer that fails puts them back. The manifest moves first, so no reader
    trusts what is left meanwhile. The folder itself stays (it carries the lock)."""
    folder = Path(folder)
    if not has_content(folder):
        return
    key = folder.resolve()
    if key in _ASIDE:  # cleared twice in one run: what the first kept aside stays the old result
        _empty(folder)
        return
    aside = _aside_name(folder, os.getpid())
    aside.mkdir()
    _ASIDE[key] = aside
    children = sorted(folder.iterdir(), key=lambda p: p.name != MANIFEST)
    for child in children:
        os.replace(child, aside / child.name)


def has_content(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def refuse_existing(out: str | os.PathLike, *, overwrite: bool) -> None:
    """Refuse an output folder that holds anything (a finished result) unless `overwrite`: what
    `atomic_dir` checks, and what a stage whose work takes minutes (bench) checks before that work.
    An empty folder (left by a killed writer) counts as absent."""
    out = Path(out)
    if has_content(out) and not overwrite:
        raise EaglekitError(f"output folder {out} already exists", hint="pass --overwrite or another --out")


@contextmanager
def atomic_dir(out: str | os.PathLike, *, overwrite: bool = False, stage: str | None = None) -> Iterator[Path]:
    """Yield an empty temporary folder; move it to `out` only if the block succeeds.

    The writer lock of `out` is held throughout, so a second writer is refused instead of racing
    this one to the final rename; an empty `out` (left by a killed writer) counts as absent.
    """
    out = Path(out)
    if not being_written(out):  # a writer at work there: writer_lock's refusal names it
        if stage is not None:
            check_owner(out, stage)
        refuse_existing(out, overwrite=overwrite)
    created = not out.exists()
    with writer_lock(out, stage=stage):
        try:
            refuse_existing(out, overwrite=overwrite)
            with _temporary_dir_beside(out) as tmp:
                yield tmp
                _move_into_place(tmp, out)
        finally:
            if created and out.is_dir() and not has_content(out):
                out.rmdir()  # nothing was written: leave no empty folder behind (still under the lock)


@contextmanager
def _temporary_dir_beside(out: Path) -> Iterator[Path]:
    # The pid in the name tells the next writer whether the folder's maker is gone (`settle_replace`).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{os.getpid()}-", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, out: Path) -> None:
    os.chmod(tmp, 0o755)
    if has_content(out):
        # Two renames: the old folder is never deleted before the new one is in place.
        old = _aside_name(out, os.getpid())
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)  # over the empty folder that carried the lock


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def emit_json(obj: Any, where: str | None) -> bool:
    """`--json [PATH]`'s output: print obj as JSON for "-" (and return True: it replaces the text
    output), write it to `where` otherwise; nothing for None."""
    if where == "-":  # options.JSON_STDOUT (artifacts is below options: no import)
        print(json.dumps(obj, indent=2, default=str))
        return True
    if where:
        write_json(where, obj)
    return False


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


def write_manifest(
    out_dir: str | os.PathLike,
    *,
    stage: str,
    config: dict,
    target: dict | None,
    inputs: dict | None = None,
    counts: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """Write `out_dir/manifest.json` and return it.

    Args:
        out_dir: the stage's output folder.
        stage: stage name ("target", "generate", "features", "train", ...).
        config: the resolved configuration of the stage.
        target: the target fingerprint (see `eaglekit.targets.fingerprint`), or None.
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
    manifest["files"] = folder_files(out_dir)
    write_json(Path(out_dir) / MANIFEST, manifest)
    return manifest


# Files a folder's manifest does not vouch for: rewritten after it (the training log grows, the
# trainer state is saved again) or hidden (a temporary file being written).
_UNLISTED = (MANIFEST, TRAIN_LOG, TRAINER_STATE)


def folder_files(folder: str | os.PathLike) -> dict[str, int]:
    """The size of every file in `folder` (its relative path -> bytes), as a manifest records them:
    what `missing_outputs` checks before a later run trusts the folder."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and rel.parts[0] not in _UNLISTED and not any(p.startswith(".") for p in rel.parts):
            files[rel.as_posix()] = path.stat().st_size
    return files


def missing_outputs(folder: str | os.PathLike) -> list[str]:
    """What is gone from a finished folder since its manifest was written, in words (empty: intact):
    the folder, its manifest, a file it lists, or a file of another size."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is missing"]
    if not (folder / MANIFEST).is_file():
        return [f"{folder / MANIFEST} is missing"]
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"{folder / MANIFEST} is unreadable"]
    if not isinstance(manifest, dict):
        return [f"{folder / MANIFEST} is not an eaglekit manifest"]
    if manifest.get("complete") is False:
        return [f"{folder} is unfinished (manifest: complete false)"]
    said = []
    for rel, size in (manifest.get("files") or {}).items():
        path = folder / rel
        if not path.is_file():
            said.append(f"{path} is missing")
        elif path.stat().st_size != size:
            said.append(f"{path} has {path.stat().st_size} bytes, its manifest says {size}")
    return said


def read_manifest(folder: str | os.PathLike, *, stage: str | None = None) -> dict:
    """Read `folder/manifest.json`; with `stage`, refuse a folder written by another stage.

    A folder without a manifest is unfinished (its writer is still running, or stopped before the
    end): the error says which, and what to run.
    """
    folder = Path(folder)
    if not folder.exists():
        raise EaglekitError(f"no such folder: {folder}", hint="check the path")
    if not (folder / MANIFEST).is_file() and folder.is_dir():
        raise unfinished_folder_error(folder, stage)
    manifest = read_json(folder / MANIFEST, what="manifest")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict) or "stage" not in manifest:
        raise EaglekitError(
            f"{folder / MANIFEST} is not an eaglekit manifest (a JSON object with 'stage' and 'config')",
            hint="the file was damaged or replaced: make the folder again",
        )
    if stage is not None and manifest.get("stage") != stage:
        raise EaglekitError(
            f"{folder} holds a '{manifest.get('stage')}' artifact, expected '{stage}'",
            hint=f"pass the output folder of `eaglekit {stage}`",
        )
    return manifest


def manifest_config(manifest: dict, folder: str | os.PathLike, *keys: str) -> list:
    """The values of `keys` in a manifest's config; a missing one names the key and the folder, so a
    hand-edited or foreign manifest is refused instead of failing deep inside a stage."""
    config = manifest["config"]
    missing = [k for k in keys if k not in config]
    if missing:
        raise EaglekitError(
            f"{Path(folder) / MANIFEST} has no {', '.join(missing)} in its config",
            hint="the manifest was edited or written by another tool: make the folder again",
        )
    return [config[k] for k in keys]


def unfinished_folder_error(folder: Path, stage: str | None) -> EaglekitError:
    """The error for a folder without a manifest, saying whether a writer is still at work."""
    command = f"`eaglekit {stage}`" if stage else "the eaglekit command that writes it"
    if being_written(folder):
        return EaglekitError(
            f"{folder} is still being written (another process holds its writer lock; no manifest yet)",
            hint=f"wait for {command} to finish, then run this again",
        )
    if not has_content(folder):
        return EaglekitError(f"{folder} is empty: no manifest.json", hint=f"pass the output folder of {command}")
    return EaglekitError(
        f"{folder} has no manifest.json: {command} did not finish writing it (killed or failed)",
        hint=f"rerun {command} with the same --out: it resumes or rewrites the folder",
    )


def unfinished_reason(manifest: dict | None) -> str | None:
    """Why the artifact a manifest describes is unfinished, or None; follows `source_manifest`
    (an export or import of an unfinished draft is unfinished too)."""
    while manifest:
        if manifest.get("unfinished_draft"):  # an export / import made with --allow-unfinished
            return manifest["unfinished_draft"]
        if manifest.get("complete") is False:
            steps = manifest.get("steps") or {}
            where = f" at step {steps['done']} of {steps['total']}" if "done" in steps and "total" in steps else ""
            return f"its `eaglekit {manifest.get('stage')}` run stopped{where} (manifest: complete false)"
        manifest = manifest.get("source_manifest")
    return None


def refuse_unfinished(reason: str | None, folder: str | os.PathLike, *, allow_unfinished: bool = False) -> str | None:
    """Refuse an unfinished artifact (`reason` says why it is one) unless `allow_unfinished`.

    Returns the reason, which a caller going on with `--allow-unfinished` records in its outputs.
    """
    if reason is None:
        return None
    if not allow_unfinished:
        running = " and is still being written" if being_written(folder) else ""
        raise EaglekitError(
            f"{folder} is unfinished{running}: {reason}",
            hint="let the run finish (a killed `eaglekit train` continues with the same command plus --resume), "
            "or pass --allow-unfinished to use it anyway (every output then says so)",
        )
    log.warning("using the unfinished artifact %s (--allow-unfinished): %s", folder, reason)
    return reason


def require_finished(folder: str | os.PathLike, *, stage: str | None = None, allow_unfinished: bool = False) -> dict:
    """The manifest of a finished folder of `stage`; refuses a missing, unfinished or other-stage one."""
    manifest = read_manifest(folder, stage=stage)
    refuse_unfinished(unfinished_reason(manifest), folder, allow_unfinished=allow_unfinished)
    return manifest


# What a target fingerprint identifies, in the words of the refusal.
FINGERPRINT_PARTS = (
    ("config_hash", "target model config"),
    ("tokenizer_hash", "tokenizer and chat template"),
    ("weights_hash", "target weights"),
)


def check_same_target(expected: dict, found: dict | None, *, what: str) -> None:
    """Refuse an artifact made for another target model, tokenizer / chat template, or weights.

    An artifact recorded before eaglekit fingerprinted weights has no `weights_hash`: that part
    cannot be checked, and a warning says so.
    """
    if found is None:
        raise EaglekitError(f"{what} records no target fingerprint", hint="regenerate it with eaglekit")
    for key, label in FINGERPRINT_PARTS:
        if key == "weights_hash" and (found.get(key) is None or expected.get(key) is None):
            log.warning(
                "%s records no weights fingerprint (made by an older eaglekit): its target weights "
                "cannot be checked, only config and tokenizer",
                what,
            )
            continue
        if expected.get(key) != found.get(key):
            raise EaglekitError(
                f"{what} was made for another {label}: {found.get(key)} != {expected.get(key)} "
                f"(made for {found.get('name')!r}, now {expected.get('name')!r})",
                hint="regenerate it with this target, or pass the target it was made for",
            )
