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
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
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
TRAIN_LOG = "log.jsonl"            # eaglekit train: one JSON event a line (train/tracker.py)
DOCTOR_REPORT = "report.json"      # eaglekit doctor --out
BENCH_RESULTS = "results.json"     # eaglekit bench --out
PIPELINE_STATE = "pipeline.json"   # eaglekit run: which stages finished, with their commands
SCALING_SUMMARY = "scaling.json"   # eaglekit run with `scaling`: the curve's table
TRAINER_STATE = "trainer_state"   # a training run folder's resume state (train/state.py); the pipeline resumes on it
# The folders of a run (`eaglekit run --out RUN`) that more than the pipeline reads: the report, the
# scaling curve and the run's summary.
RUN_DRAFT = "draft"       # eaglekit train --out
RUN_EXPORT = "export"     # one folder per format under it
RUN_DOCTOR = "doctor"
RUN_BENCH = "bench"
RUN_SCALING = "scaling"   # one slice run per fraction under it, and SCALING_SUMMARY
CONVERSATION_SHARDS = "conversations"   # a generate folder's shards: conversations-00000.jsonl, ...
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
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        if not _try_flock(fd, fcntl.LOCK_EX, LOCK_WAIT_S):
            raise EaglekitError(f"another {_writer_name(stage)} is writing to {folder}",
                                hint="wait for it to finish, or use another --out")
        if stage is not None:
            refuse_other_stage(folder, stage)
        yield folder
    finally:
        os.close(fd)  # closing releases the lock


# A writer's lock name where it differs from the stage its manifest records.
_MANIFEST_STAGE = {"target prepare": "target"}


def refuse_other_stage(folder: Path, stage: str) -> None:
    """Refuse to write (or --overwrite) a folder another stage made: `bench --out runs/draft` once
    replaced the draft's manifest with bench's, exit 0, and the draft then read as unfinished."""
    try:
        found = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        return   # no manifest (or a torn one): the stage's own checks decide
    want = _MANIFEST_STAGE.get(stage, stage)
    if isinstance(found, str) and found != want:
        raise EaglekitError(f"{folder} holds the output of `eaglekit {found}`, not of {_writer_name(stage)}",
                            hint="pass another --out; writing here would replace that stage's manifest")


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
    """Empty a folder whose writer lock the caller holds; the manifest goes first, so no reader
    trusts what is left while the rest is deleted. The folder itself stays (it carries the lock)."""
    folder = Path(folder)
    (folder / MANIFEST).unlink(missing_ok=True)
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


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
    if not being_written(out):   # a writer at work there: writer_lock's refusal names it
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, out: Path) -> None:
    os.chmod(tmp, 0o755)
    if has_content(out):
        # Two renames: the old folder is never deleted before the new one is in place.
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
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
    if where == "-":                 # options.JSON_STDOUT (artifacts is below options: no import)
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


def write_manifest(out_dir: str | os.PathLike, *, stage: str, config: dict, target: dict | None,
                   inputs: dict | None = None, counts: dict | None = None,
                   extra: dict | None = None) -> dict:
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
    write_json(Path(out_dir) / MANIFEST, manifest)
    return manifest


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
        raise EaglekitError(f"{folder / MANIFEST} is not an eaglekit manifest (a JSON object with 'stage' and "
                            "'config')", hint="the file was damaged or replaced: make the folder again")
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
        raise EaglekitError(f"{Path(folder) / MANIFEST} has no {', '.join(missing)} in its config",
                            hint="the manifest was edited or written by another tool: make the folder again")
    return [config[k] for k in keys]


def unfinished_folder_error(folder: Path, stage: str | None) -> EaglekitError:
    """The error for a folder without a manifest, saying whether a writer is still at work."""
    command = f"`eaglekit {stage}`" if stage else "the eaglekit command that writes it"
    if being_written(folder):
        return EaglekitError(f"{folder} is still being written (another process holds its writer lock; "
                             "no manifest yet)", hint=f"wait for {command} to finish, then run this again")
    if not has_content(folder):
        return EaglekitError(f"{folder} is empty: no manifest.json", hint=f"pass the output folder of {command}")
    return EaglekitError(f"{folder} has no manifest.json: {command} did not finish writing it (killed or failed)",
                         hint=f"rerun {command} with the same --out: it resumes or rewrites the folder")


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
                 "or pass --allow-unfinished to use it anyway (every output then says so)")
    log.warning("using the unfinished artifact %s (--allow-unfinished): %s", folder, reason)
    return reason


def require_finished(folder: str | os.PathLike, *, stage: str | None = None,
                     allow_unfinished: bool = False) -> dict:
    """The manifest of a finished folder of `stage`; refuses a missing, unfinished or other-stage one."""
    manifest = read_manifest(folder, stage=stage)
    refuse_unfinished(unfinished_reason(manifest), folder, allow_unfinished=allow_unfinished)
    return manifest


# What a target fingerprint identifies, in the words of the refusal.
FINGERPRINT_PARTS = (("config_hash", "target model config"), ("tokenizer_hash", "tokenizer and chat template"),
                     ("weights_hash", "target weights"))


def check_same_target(expected: dict, found: dict | None, *, what: str) -> None:
    """Refuse an artifact made for another target model, tokenizer / chat template, or weights.

    An artifact recorded before eaglekit fingerprinted weights has no `weights_hash`: that part
    cannot be checked, and a warning says so.
    """
    if found is None:
        raise EaglekitError(f"{what} records no target fingerprint", hint="regenerate it with eaglekit")
    for key, label in FINGERPRINT_PARTS:
        if key == "weights_hash" and (found.get(key) is None or expected.get(key) is None):
            log.warning("%s records no weights fingerprint (made by an older eaglekit): its target weights "
                        "cannot be checked, only config and tokenizer", what)
            continue
        if expected.get(key) != found.get(key):
            raise EaglekitError(
                f"{what} was made for another {label}: {found.get(key)} != {expected.get(key)} "
                f"(made for {found.get('name')!r}, now {expected.get('name')!r})",
                hint="regenerate it with this target, or pass the target it was made for",
            )
