"""The prompts stage: read sources, filter by length, deduplicate, mix by weight, split stably.

Output folder: `train.jsonl`, `validation.jsonl` (one `Prompt` a line), `malformed.txt` (every
record that could not be read, as `file:line: reason`) and `manifest.json` (stage "prompts").

Mixing: each source gets a number of prompts, `round(weight * unique prompts it holds)`, or with
`num_prompts` set, `round(num_prompts * weight / sum of weights)`. A source asked for more prompts
than it holds repeats them (ids get `#r1`, `#r2` ...; useful when answers are sampled); one asked
for fewer gives a hash-chosen subset. The split is decided by a hash of each prompt's content
before repetition, so a prompt and its repeats always share a split and a rerun gives the same
split whatever else is mixed in. A source's own `validation-fraction=` replaces the build's share for
its prompts: `--validation-fraction 0` with `validation-fraction=0.05` on the chat-like sources holds
out chat alone, so training's validation predicts what a chat bench measures (a held-out share of a
mix of FLAN, T0 and GSM8K predicted far more than MT-bench then accepted:
docs/results/2026-12-06-cpu-walk-vs-engine). The manifest counts each source's held-out prompts.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from eaglekit.artifacts import atomic_dir, write_manifest
from eaglekit.data.folder import write_jsonl
from eaglekit.data.options import PromptsBuildOptions
from eaglekit.data.readers import ReadReport, SourceSpec, read_source
from eaglekit.data.records import SPLITS, Prompt, order_key, split_of
from eaglekit.errors import EaglekitError

log = logging.getLogger(__name__)
SHOW_MALFORMED = 10  # lines of malformed records printed; all of them go to malformed.txt


@dataclass(frozen=True)
class Filters:
    """Length limits on a prompt (all user turns and the system prompt together)."""

    min_chars: int = 1
    max_chars: int | None = None
    max_tokens: int | None = None  # needs a tokenizer
    max_turns: int | None = None

    def narrowed(self, spec: SourceSpec) -> "Filters":
        """These limits and a source's own (`min-chars=`, `max-chars=`), the tighter of each."""
        longest = [x for x in (self.max_chars, spec.max_chars) if x is not None]
        return replace(
            self, min_chars=max(self.min_chars, spec.min_chars or 0), max_chars=min(longest) if longest else None
        )


def build_prompts(
    sources: list[SourceSpec],
    out: str | Path,
    *,
    filters: Filters = Filters(),
    validation_fraction: float = PromptsBuildOptions.validation_fraction,
    num_prompts: int | None = None,
    seed: int = 0,
    tokenizer=None,
    strict: bool = False,
    overwrite: bool = False,
) -> dict:
    """Build a prompts folder from several sources and return its manifest.

    Args:
        sources: the sources with their weights.
        out: output folder (written atomically).
        filters: length limits.
        validation_fraction: share of unique prompts held out for validation (hash-based), for every
            source without its own `validation-fraction=`.
        num_prompts: total prompts in the mix (train + validation); None keeps `weight x size`.
        seed: changes the split and the subset chosen; the same seed gives the same output.
        tokenizer: the target's tokenizer, needed for `filters.max_tokens`.
        strict: a malformed record is an error instead of being skipped and reported.
        overwrite: replace an existing output folder.
    """
    if not sources:
        raise EaglekitError("no prompt source given", hint="pass --source FILE (repeatable)")
    if filters.max_tokens is not None and tokenizer is None:
        raise EaglekitError("--max-tokens needs the target's tokenizer", hint="pass --target")
    seen: set[str] = set()
    pools: list[list[Prompt]] = []
    per_source: list[dict] = []
    malformed: list[str] = []
    for spec in sources:
        report = read_source(spec)
        if report.records == 0:
            raise EaglekitError(
                f"{spec.location} holds no records (empty or whitespace only)",
                hint="pass a file with prompt records, or drop the source",
            )
        check_malformed(spec, report, strict)
        malformed += report.malformed
        kept, stats = filter_and_dedup(report, filters.narrowed(spec), tokenizer, seen)
        pools.append(kept)
        per_source.append(
            {
                "source": spec.location,
                "name": spec.display_name(),
                "weight": spec.weight,
                "records": report.records,
                "malformed": len(report.malformed),
                **stats,
            }
        )
    wanted = source_counts(sources, [len(p) for p in pools], num_prompts)
    chosen: list[Prompt] = []
    split: dict[int, str] = {}  # id(prompt) -> its split, decided by its own source's held-out share
    for spec, pool, count, stats in zip(sources, pools, wanted, per_source):
        if count > len(pool) and pool:
            log.warning(
                "source %s holds %d unique prompts but its weight asks for %d: repeating prompts",
                stats["name"],
                len(pool),
                count,
            )
        share = validation_fraction if spec.validation_fraction is None else spec.validation_fraction
        taken = take(pool, count, seed)
        for prompt in taken:
            split[id(prompt)] = split_of(prompt, share, seed)
        chosen += taken
        stats["taken"] = count
        stats["validation"] = sum(split[id(p)] == "validation" for p in taken)
    chosen = unique_ids(chosen)
    chosen.sort(key=lambda p: order_key(p, seed))
    by_split: dict[str, list[Prompt]] = {s: [] for s in SPLITS}
    for prompt in chosen:
        by_split[split[id(prompt)]].append(prompt)
    if not chosen:
        raise EaglekitError("no prompt left after filtering", hint="check the sources and the length limits")
    config = {
        "sources": [s.to_config() for s in sources],
        "filters": filters.__dict__,
        "validation_fraction": validation_fraction,
        "num_prompts": num_prompts,
        "seed": seed,
    }
    inputs = {s.location: s.fingerprint() for s in sources}
    counts = {
        "train": len(by_split["train"]),
        "validation": len(by_split["validation"]),
        "malformed": len(malformed),
        "sources": per_source,
    }
    return write_prompt_folder(
        out, by_split, config=config, inputs=inputs, counts=counts, malformed=malformed, overwrite=overwrite
    )


def write_prompt_folder(
    out: str | Path,
    by_split: dict[str, list[Prompt]],
    *,
    config: dict,
    inputs: dict,
    counts: dict,
    malformed: list[str] = (),
    target: dict | None = None,
    overwrite: bool = False,
    extra: dict | None = None,
) -> dict:
    """Write train/validation JSONL, malformed.txt and the manifest into `out`, atomically."""
    with atomic_dir(out, overwrite=overwrite, stage="prompts") as tmp:
        for split in SPLITS:
            write_jsonl(tmp / f"{split}.jsonl", (p.to_json() for p in by_split.get(split, [])))
        (tmp / "malformed.txt").write_text("".join(line + "\n" for line in malformed), encoding="utf-8")
        manifest = write_manifest(
            tmp,
            stage="prompts",
            config=config,
            target=target,
            inputs=inputs,
            counts=counts,
            extra=(extra or {}) | {"malformed_examples": list(malformed[:100])},
        )
    log.info("wrote %s: %d train, %d validation prompts", out, counts.get("train", 0), counts.get("validation", 0))
    return manifest


def check_malformed(spec: SourceSpec, report: ReadReport, strict: bool) -> None:
    """Log malformed records with their location; raise when strict or when nothing was readable."""
    if not report.malformed:
        return
    shown = "\n  ".join(report.malformed[:SHOW_MALFORMED])
    more = len(report.malformed) - SHOW_MALFORMED
    listing = shown + (f"\n  ... and {more} more" if more > 0 else "")
    if strict or not report.prompts:
        why = "no record could be read" if not report.prompts else "malformed records (--strict)"
        raise EaglekitError(
            f"{spec.location}: {why}:\n  {listing}",
            hint="fix the records, or name the format: FILE,format=sharegpt|openai|alpaca|turns|prompt|text"
            + ("" if not strict else "; without --strict they are skipped and reported"),
        )
    log.warning(
        "%s: skipped %d malformed of %d records (all listed in malformed.txt):\n  %s",
        spec.location,
        len(report.malformed),
        report.records,
        listing,
    )


def filter_and_dedup(report: ReadReport, filters: Filters, tokenizer, seen: set[str]) -> tuple[list[Prompt], dict]:
    """Prompts within the length limits and not seen before (in this or an earlier source)."""
    kept: list[Prompt] = []
    stats = Counter(too_short=0, too_long=0, too_many_turns=0, duplicates=0)
    for prompt in report.prompts:
        if prompt.num_chars < filters.min_chars:
            stats["too_short"] += 1
        elif filters.max_chars is not None and prompt.num_chars > filters.max_chars:
            stats["too_long"] += 1
        elif filters.max_turns is not None and len(prompt.turns) > filters.max_turns:
            stats["too_many_turns"] += 1
        elif filters.max_tokens is not None and count_tokens(tokenizer, prompt) > filters.max_tokens:
            stats["too_long"] += 1
        elif (key := prompt.dedup_key()) in seen:
            stats["duplicates"] += 1
        else:
            seen.add(key)
            kept.append(prompt)
    stats["unique"] = len(kept)
    return kept, dict(stats)


def count_tokens(tokenizer, prompt: Prompt) -> int:
    texts = prompt.turns + ([prompt.system] if prompt.system else [])
    return sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts)


def source_counts(sources: list[SourceSpec], sizes: list[int], num_prompts: int | None) -> list[int]:
    """Prompts to take from each source (see the module docstring)."""
    if num_prompts is None:
        return [round(s.weight * n) for s, n in zip(sources, sizes)]
    if num_prompts < 1:
        raise EaglekitError(f"--num-prompts {num_prompts} < 1", hint="ask for at least one prompt")
    total = sum(s.weight for s in sources)
    exact = [num_prompts * s.weight / total for s in sources]
    counts = [math.floor(x) for x in exact]
    # Largest remainders get the prompts rounding left over, so the counts sum to num_prompts.
    for i in sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)[: num_prompts - sum(counts)]:
        counts[i] += 1
    for spec, size, count in zip(sources, sizes, counts):
        if count and not size:
            raise EaglekitError(
                f"source {spec.location} has no prompt left but its weight asks for {count}",
                hint="check its length limits, or drop it",
            )
    return counts


def take(pool: list[Prompt], count: int, seed: int) -> list[Prompt]:
    """`count` prompts of `pool`: a hash-ordered subset, or whole passes plus a subset (repeats)."""
    if not pool or count <= 0:
        return []
    ordered = sorted(pool, key=lambda p: order_key(p, seed))
    out = []
    for n in range(count):
        prompt = ordered[n % len(ordered)]
        rep = n // len(ordered)
        out.append(
            prompt
            if rep == 0
            else Prompt(id=f"{prompt.id}#r{rep}", source=prompt.source, turns=prompt.turns, system=prompt.system)
        )
    return out


def unique_ids(prompts: list[Prompt]) -> list[Prompt]:
    """Make ids unique across sources: a clash gets the source name in front, then a counter."""
    counts = Counter(p.id for p in prompts)
    used: set[str] = set()
    for prompt in prompts:
        new = prompt.id if counts[prompt.id] == 1 else f"{prompt.source}/{prompt.id}"
        base, n = new, 1
        while new in used:
            n += 1
            new = f"{base}~{n}"
        prompt.id = new
        used.add(new)
    return prompts
