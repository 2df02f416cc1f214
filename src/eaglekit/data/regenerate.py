"""The generate stage: the target answers every prompt; the output is resumable.

Output folder: `conversations-00000.jsonl`, ... (one conversation a line, see
`eaglekit.data.records`), `skipped.jsonl` (prompts that did not fit the context, with the reason),
`run.json` (what this folder is being made from) and, once every prompt is accounted for,
`manifest.json` (stage "generate"). Without `manifest.json` the folder is unfinished: rerun the
same command and it carries on. Lines are only appended, an id is written once, and a torn last
line from a kill is dropped on restart, so no prompt is lost or answered twice.

With `worker=(i, n)` the folder answers only prompts i, i + n, i + 2n, ... of each split: one
worker of `eaglekit generate --devices` (`eaglekit.data.parallel`), whose run.json records the split.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from eaglekit.artifacts import (
    CONVERSATION_SHARDS,
    MANIFEST,
    clear_folder,
    read_json,
    read_manifest,
    sha256_file,
    sha256_json,
    write_json,
    write_manifest,
    writer_lock,
)
from eaglekit.data.folder import JsonlShards, read_prompt_folder
from eaglekit.data.options import GenerateOptions
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.data.records import SPLITS, Conversation, Prompt
from eaglekit.errors import DiskFull, EaglekitError, from_os_error
from eaglekit.features.conversations import conversation_files
from eaglekit.progress import Progress as Meter
from eaglekit.runtime.sampling import Sampling

log = logging.getLogger(__name__)
RUN_FILE = "run.json"
LOOP_WARN = 0.10  # warn when more of the answer tokens than this are loops (`data.quality`)


@dataclass(frozen=True)
class GenerateConfig:
    """What decides the content of a generate folder (a resumed run must use the same); the defaults
    are `eaglekit generate`'s (GenerateOptions)."""

    max_new_tokens: int = GenerateOptions.max_new_tokens
    sampling: Sampling = Sampling()
    seed: int = GenerateOptions.seed  # the backend's seed (a generator's torch seed, or the base of per-request seeds)
    splits: tuple[str, ...] = tuple(GenerateOptions.splits.split(","))
    limit: int | None = GenerateOptions.limit  # first N prompts of each split (smoke runs, benchmarks)
    stop_loops: int = (
        GenerateOptions.stop_loops
    )  # the engine's loop check (`data.batch_decoder.BatchDecoder`): it cuts answers

    def to_json(self) -> dict:
        # The seed stays inside "sampling", where folders written before it moved out of Sampling have
        # it: their run.json still matches, so they resume. stop_loops is written only when set, for
        # the same reason.
        return {
            "max_new_tokens": self.max_new_tokens,
            "sampling": self.sampling.to_dict() | {"seed": self.seed},
            "splits": list(self.splits),
            "limit": self.limit,
        } | ({"stop_loops": self.stop_loops} if self.stop_loops else {})


def load_prompts(location: str, splits: tuple[str, ...], limit: int | None) -> tuple[dict[str, list[Prompt]], dict]:
    """Prompts by split from an `eaglekit prompts` folder, or all of one file (split "train")."""
    path = Path(location)
    # A folder holding every split's file is an `eaglekit prompts` folder, finished (a manifest) or
    # not: read as raw files, its validation prompts would be answered as training data.
    if path.is_dir() and ((path / MANIFEST).is_file() or all((path / f"{s}.jsonl").is_file() for s in SPLITS)):
        manifest, by_split = read_prompt_folder(path, splits)  # without a manifest: says what to run
        # Content hashes only: the folder may be moved between a kill and the resume.
        inputs = {
            "prompts": {
                "manifest_config": sha256_json(manifest.get("config")),
                **{s: sha256_file(path / f"{s}.jsonl") for s in splits},
            }
        }
    else:
        spec = SourceSpec.parse(location)
        report = read_source(spec)
        report.prompts = [p for p in report.prompts if spec.keeps(p)]
        if report.malformed:
            raise EaglekitError(
                f"{location}: {len(report.malformed)} malformed records, e.g. {report.malformed[0]}",
                hint="clean the prompts with `eaglekit prompts build` first",
            )
        ids = Counter(p.id for p in report.prompts)
        if any(n > 1 for n in ids.values()):
            raise EaglekitError(
                f"{location}: ids repeat (e.g. {next(i for i, n in ids.items() if n > 1)!r})",
                hint="build a prompts folder with `eaglekit prompts build` (it makes ids unique)",
            )
        by_split = {"train": report.prompts}
        inputs = {"prompts": spec.fingerprint()}
    if limit is not None:
        by_split = {s: p[:limit] for s, p in by_split.items()}
    if not any(by_split.values()):
        raise EaglekitError(
            f"{location} holds no prompts (splits {', '.join(by_split)})",
            hint="the file is empty or whitespace only: pass prompts, one record a line",
        )
    return by_split, inputs


class Progress:
    """Prompts/s and tokens/s of this run (`eaglekit.progress`: a bar on a terminal, else a line every
    30 s with the time left)."""

    def __init__(self, total: int, done: int):
        self.tokens = 0
        self.meter = Meter(total, done=done, desc="generate", unit="prompt")

    def update(self, prompts: int, tokens: int) -> None:
        self.tokens += tokens
        elapsed = max(time.perf_counter() - self.meter.start, 1e-9)
        self.meter.update(prompts, tok_s=f"{self.tokens / elapsed:,.0f}")

    def close(self) -> dict:
        elapsed = max(self.meter.close(), 1e-9)
        prompts = self.meter.counted
        return {
            "seconds": round(elapsed, 3),
            "prompts": prompts,
            "tokens": self.tokens,
            "prompts_per_s": round(prompts / elapsed, 3),
            "tokens_per_s": round(self.tokens / elapsed, 1),
        }


def generate_conversations(
    prompts: str,
    out: str | Path,
    *,
    backend,
    target_fp: dict,
    config: GenerateConfig,
    shard_size: int = GenerateOptions.shard_size,
    overwrite: bool = False,
    worker: tuple[int, int] | None = None,
) -> dict:
    """Answer every prompt with `backend`, appending to `out`; return the manifest when done.

    Args:
        prompts: an `eaglekit prompts` folder, or one prompt file.
        out: the output folder (created, or resumed when it holds an unfinished run of the same config).
        backend: a chat-level backend (`LocalBackend` or `OpenAIBackend`) with `run(conversations)`.
        target_fp: the target's fingerprint (`Target.fingerprint()`).
        config: the settings that decide the content.
        shard_size: conversations per shard.
        overwrite: delete an existing output folder first.
        worker: (i, n): answer only prompts i, i + n, ... of each split (worker i of n).
    """
    out = Path(out)
    by_split, inputs = load_prompts(prompts, config.splits, config.limit)
    identity = {"target": target_fp, "config": config.to_json(), "inputs": inputs}
    if worker is not None:
        index, count = worker
        by_split = {s: p[index::count] for s, p in by_split.items()}
        identity["data_parallel"] = {"worker": index, "workers": count}
    with generate_folder(out, identity, overwrite) as finished:
        if finished is not None:
            return finished
        return _run(out, by_split, backend, identity, config, shard_size)


@contextmanager
def generate_folder(out: Path, identity: dict, overwrite: bool) -> Iterator[dict | None]:
    """Hold the folder's writer lock (taken before --overwrite deletes anything) and yield its
    finished manifest, or None once a resume is known to continue the same work."""
    with writer_lock(out, stage="generate"):
        if overwrite:
            clear_folder(out)
        finished = finished_manifest(out, identity)
        if finished is None:
            check_resume(out, identity)
        yield finished


def finished_manifest(out: Path, identity: dict) -> dict | None:
    """The manifest of a finished folder made from `identity` (None if unfinished or new); refuse another's."""
    if not (out / MANIFEST).is_file():
        return None
    # Rerunning a finished command is a no-op (a pipeline killed right after this stage reruns it).
    check_resume(out, identity, finished=True)
    conversation_files(out)  # what it holds is what the manifest counted (else: make it again)
    log.info("%s is already complete: nothing to do", out)
    return read_manifest(out, stage="generate")


def check_resume(out: Path, identity: dict, finished: bool = False) -> None:
    """Refuse to resume (or call finished) a folder made from another target, prompts, settings or split."""
    run_file = out / RUN_FILE
    state = "a finished" if finished else "an unfinished"
    if run_file.is_file():
        before = read_json(run_file, what="run file")
        if before.get("data_parallel") != identity.get("data_parallel"):
            raise EaglekitError(
                f"{out} holds {state} run made by {describe_split(before.get('data_parallel'))}; "
                f"this run is {describe_split(identity.get('data_parallel'))}",
                hint="pass --overwrite to start over, or another --out"
                if finished
                else "rerun with as many --devices as before (which ones does not matter: the prompts are split "
                "by count) to resume, or pass --overwrite to start over",
            )
        for key in ("target", "config", "inputs"):
            if before.get(key) != identity[key]:
                raise EaglekitError(
                    f"{out} holds {state} run with another {key}: {before.get(key)} != {identity[key]}",
                    hint="pass --overwrite to start over, or another --out"
                    if finished
                    else "rerun with the same settings to resume, or pass --overwrite to start over",
                )
    elif any(out.iterdir()):
        raise EaglekitError(f"{out} is not empty and holds no eaglekit generate run", hint="use an empty or new --out")
    else:
        write_json(run_file, identity)


def describe_split(data_parallel: dict | None) -> str:
    """How a run was split over processes, in words ("one process", "2 workers (--devices)", ...)."""
    if data_parallel is None:
        return "one process (no --devices)"
    if "worker" in data_parallel:
        return f"worker {data_parallel['worker']} of {data_parallel['workers']}"
    return f"{data_parallel['workers']} workers (--devices with {data_parallel['workers']} devices)"


def _run(
    out: Path, by_split: dict[str, list[Prompt]], backend, identity: dict, config: GenerateConfig, shard_size: int
) -> dict:
    shards = JsonlShards(out, CONVERSATION_SHARDS, shard_size)
    skipped = JsonlShards(out, "skipped", None)  # one file, same append-and-recover rules
    rows = shards.recover()
    skipped_rows = skipped.recover()
    split_of = {p.id: s for s, prompts in by_split.items() for p in prompts}
    if len(split_of) != sum(len(p) for p in by_split.values()):
        raise EaglekitError("a prompt id appears in more than one split", hint="rebuild the prompts folder")
    done = shards.ids | skipped.ids
    stray = [i for i in done if i not in split_of]
    if stray:
        raise EaglekitError(
            f"{out} holds answers to prompts that are not in the input (e.g. {stray[0]!r})",
            hint="pass the same prompts to resume, or --overwrite",
        )
    pending = [Conversation(p, s) for s, prompts in by_split.items() for p in prompts if p.id not in done]
    if done:
        log.info("resuming %s: %d of %d prompts done, %d to go", out, len(done), len(split_of), len(pending))
    progress = Progress(len(split_of), len(done))
    try:
        for finished in backend.run(pending):
            answered = [c for c in finished if c.answers]
            shards.append([c.to_json() for c in answered])
            skipped.append(
                [
                    {"id": c.prompt.id, "source": c.prompt.source, "split": c.split, "reason": c.skipped}
                    for c in finished
                    if not c.answers
                ]
            )
            progress.update(len(finished), sum(a.num_tokens for c in finished for a in c.answers))
    except OSError as err:
        if not isinstance(from_os_error(err), DiskFull):
            raise
        raise DiskFull(
            f"the disk is full: {out} could not take more answers (the answers written before, about "
            f"{len(shards.ids | skipped.ids)} of {len(split_of)} prompts, are kept)",
            hint="free space on that disk and run the same command again: it resumes with the prompts "
            "not answered yet (a line cut off by the full disk is dropped)",
        ) from err
    finally:
        shards.close()
        skipped.close()
        speed = progress.close()
    missing = set(split_of) - shards.ids - skipped.ids
    if missing:
        raise EaglekitError(
            f"{len(missing)} prompts were not answered (e.g. {sorted(missing)[0]!r})",
            hint="rerun the same command to finish them",
        )
    return _finish(out, shards, identity, config, speed, backend, rows, skipped_rows)


def _finish(
    out: Path,
    shards: JsonlShards,
    identity: dict,
    config: GenerateConfig,
    speed: dict,
    backend,
    earlier: list[dict],
    earlier_skipped: list[dict],
) -> dict:
    """Count what is on disk (this run and earlier ones) and write the manifest."""
    counts = conversation_counts(out, shards.shard_size)
    resolved = identity["config"] | {
        "backend": backend.name,
        "model": getattr(backend, "model", None) if isinstance(getattr(backend, "model", None), str) else None,
        "resumed_from": len(earlier) + len(earlier_skipped),
    }
    extra = {"throughput_last_run": speed}
    decoder = backend.run_stats() if hasattr(backend, "run_stats") else None
    if decoder:
        extra["decoder"] = decoder
        for loop in decoder["serve_loops"]:
            log.info(
                "decoder: %d rows x %d slots, %d steps (%s ms each), occupancy %.2f; device seconds: "
                "decode %s, refill %s (%d forwards, %d prompt tokens, %d padded, %d resumed from the rows' "
                "caches; %d graphs captured in %s s of it, %d forwards eager before their bucket's capture), "
                "other %s of %s wall",
                loop["rows"],
                loop["slots"],
                loop["steps"],
                loop.get("step_ms"),
                loop["occupancy"],
                loop.get("decode_s", 0),
                loop.get("refill_s", 0),
                loop.get("refill_forwards", 0),
                loop["refill_tokens"],
                loop["refill_padded_tokens"],
                loop.get("resumed_tokens", 0),
                loop.get("refill_graphs", 0),
                loop.get("refill_capture_s", 0),
                loop.get("refill_eager_forwards", 0),
                loop["other_s"],
                loop["wall_s"],
            )
            if "host_wait_s" in loop:
                log.info(
                    "decoder host seconds: waiting at the sync %s, ended rows %s, answers handed out %s, "
                    "requests taken and refills queued %s; %s steps queued ahead of that work a round",
                    loop["host_wait_s"],
                    loop["host_ended_s"],
                    loop["host_answers_s"],
                    loop["host_take_s"],
                    loop.get("cover_steps"),
                )
    manifest = write_manifest(
        out,
        stage="generate",
        config=resolved,
        target=identity["target"],
        inputs=identity["inputs"],
        counts=counts,
        extra=extra,
    )
    loops = (counts["answer_tokens_in_loops"] or 0) / max(counts["answer_tokens_checked_for_loops"], 1)
    if loops > LOOP_WARN and not config.stop_loops:
        log.warning(
            "%.0f %% of the answer tokens are loops at the end of answers (the target repeats itself until "
            "cut): cheap to draft, little to learn from; --stop-loops 128 (the engine) ends an answer once "
            "it loops, a lower --max-new-tokens cuts every answer",
            100 * loops,
        )
    elif loops > LOOP_WARN:
        log.info(
            "%.0f %% of the answer tokens are the starts of loops that --stop-loops %d ended (each keeps its "
            "last %d tokens and the block they repeat)",
            100 * loops,
            config.stop_loops,
            config.stop_loops,
        )
    log.info(
        "wrote %s: %d conversations (%s), %d skipped, %d answer tokens; last run %.1f prompts/s, %.0f tokens/s",
        out,
        counts["conversations"],
        counts["by_split"],
        counts["skipped"],
        counts["answer_tokens"],
        speed["prompts_per_s"],
        speed["tokens_per_s"],
    )
    return manifest


def conversation_counts(out: Path, shard_size: int) -> dict:
    """The manifest's counts of the shards and skipped prompts in `out` (ids checked unique)."""
    shards = JsonlShards(out, CONVERSATION_SHARDS, shard_size)
    rows = shards.recover()
    skipped = JsonlShards(out, "skipped", None).recover()
    by_split = Counter(r["split"] for r in rows)
    finish = Counter(r["meta"]["finish_reason"] for r in rows)
    # Answers by where their num_tokens comes from; rows written before it was recorded: "unrecorded".
    counted_by = Counter(t.get("counted_by", "unrecorded") for r in rows for t in r["meta"]["turns"])
    turns = [t for r in rows for t in r["meta"]["turns"]]
    # finish_reason is per conversation (its worst turn); these are per answer: how much of the data
    # is answers cut at the token limit (a small target often loops until it is cut).
    by_answer = Counter(t["finish_reason"] for t in turns)
    cut = sum(t["num_tokens"] for t in turns if t["finish_reason"] == "length")
    checked = [t for t in turns if "loop_tokens" in t]
    return {
        "conversations": len(rows),
        "by_split": dict(by_split),
        "skipped": len(skipped),
        "assistant_turns": len(turns),
        "answer_tokens": sum(r["meta"]["num_tokens"] for r in rows),
        "counted_by": dict(counted_by),
        "finish_reason": dict(finish),
        "answer_finish_reason": dict(by_answer),
        "answer_tokens_cut_at_limit": cut,
        # Over the answers whose loops were looked for (eaglekit's own backends); None: none were.
        "answer_tokens_in_loops": (sum(t["loop_tokens"] for t in checked) if checked else None),
        "answer_tokens_checked_for_loops": sum(t["num_tokens"] for t in checked),
        "shards": [p.name for p in shards.paths()],
    }
