"""`eaglekit doctor`: static checks, then the live probe, then the diagnosis, as one report."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from eaglekit.artifacts import refuse_unfinished
from eaglekit.data.folder import read_prompt_folder
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.doctor.checks import FAIL, PASS, WARN, Check, Context, run_checks
from eaglekit.doctor.diagnose import diagnose, engine_setup
from eaglekit.doctor.options import DoctorOptions
from eaglekit.doctor.probe import probe, run_target
from eaglekit.errors import EaglekitError
from eaglekit.formats.detect import interpret
from eaglekit.formats.facts import target_facts
from eaglekit.formats.folder import read_folder
from eaglekit.formats.options import ExportOptions
from eaglekit.formats.registry import FORMATS
from eaglekit.metrics import cumulative_acceptance
from eaglekit.targets.load import DTYPES, dtype_name, load_target, resolve_device
from eaglekit.train.manifest import validated_steps

log = logging.getLogger(__name__)

NATIVE_ENGINE = "sglang"  # the native checkpoint has SGLang's names and config
BUILTIN_PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for staying healthy.",
    "Count from 1 to 20, separated by commas.",
    "Explain in two sentences what a hash table is.",
    "Write a short poem about the sea.",
)


@dataclass
class Report:
    draft: str
    target: str
    engine: str
    format: str
    checks: list[Check]
    probe: dict | None = None
    notes: list[str] = field(default_factory=list)
    unfinished: str | None = None  # why the draft is unfinished, when checked with --allow-unfinished

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "draft": self.draft,
            "target": self.target,
            "engine": self.engine,
            "format": self.format,
            "checks": [c.to_dict() for c in self.checks],
            "probe": self.probe,
            "notes": self.notes,
            "unfinished_draft": self.unfinished,
        }


def load_prompts(spec: str | None, limit: int) -> list[list[dict]]:
    """Chat messages of the probe prompts' first turns: built-in, a prompts file (any format
    `eaglekit data` reads) or an `eaglekit prompts` folder."""
    if spec in (None, "builtin"):
        return [[{"role": "user", "content": p}] for p in BUILTIN_PROMPTS[:limit]]
    prompts = folder_prompts(spec) if Path(spec).is_dir() else file_prompts(spec)
    return [type(p)(id=p.id, source=p.source, turns=p.turns[:1], system=p.system).messages() for p in prompts[:limit]]


def folder_prompts(spec: str) -> list:
    """An `eaglekit prompts` folder's validation split, as bench reads it (another stage's folder, a
    draft or conversations, is refused by its stage; it read as a JSON file's error)."""
    return read_prompt_folder(spec, splits=("validation",))[1]["validation"]


def file_prompts(spec: str) -> list:
    source = SourceSpec.parse(spec)
    report = read_source(source)
    if report.malformed:  # once skipped without a word, where bench refuses the same file
        raise EaglekitError(
            f"{len(report.malformed)} malformed record(s) in the probe's prompts {spec}: "
            + "; ".join(report.malformed[:3]),
            hint="fix or remove those lines (`eaglekit bench` refuses them too)",
        )
    prompts = [p for p in report.prompts if source.keeps(p)]
    if not prompts:
        raise EaglekitError(f"no prompts read from {spec}", hint="pass a JSONL/JSON/text file of prompts")
    return prompts


def training_tau(manifest: dict | None, k: int) -> tuple[float | None, str]:
    """The accept length training predicts for chain drafting of k tokens, from a checkpoint manifest
    (its best validation, `eaglekit train`'s `best`; an export's `source_manifest` holds it).

    Uses the walk accept length training measures (greedy chain decoding replayed over held-out
    answers) for a chain of k drafts, else the per-step conditional acceptance over the first k
    steps (`metrics.cumulative_acceptance`), else the simulated accept length.
    """
    for block in (manifest or {}, (manifest or {}).get("source_manifest") or {}):
        best = block.get("best") or {}
        by_k = best.get("walk_accept_length_by_k") or []
        if 1 <= k <= len(by_k):
            return float(by_k[k - 1]), f"training's walk accept length (chain of {k})"
        walk = best.get("walk_accept_length")
        if walk is not None and validated_steps(block) == k:
            return float(walk), f"training's walk accept length (chain of {k})"
        cond = best.get("cond_acc")
        if isinstance(cond, list) and cond:
            return round(
                1.0 + sum(cumulative_acceptance(cond[:k])), 3
            ), f"training's conditional acceptance over {min(k, len(cond))} steps"
        if best.get("sim_accept_length") is not None:
            return float(best["sim_accept_length"]), "training's simulated accept length"
    return None, "no training metrics recorded"


def speculative_tokens(folder) -> int:
    """The draft tokens per step a folder is served at: the ones its config names for its engine (a
    speculators config's, which vLLM reads when given no num_speculative_tokens), else the export
    manifest's, else export's default."""
    named = next((k for f in FORMATS.values() if (k := f.speculative_tokens(folder.config))), None)
    config = (folder.manifest or {}).get("config") or {}
    return int(named or config.get("speculative_tokens") or ExportOptions.speculative_tokens)


def run_doctor(
    draft: str | Path,
    target: str = DoctorOptions.target,
    *,
    engine: str | None = None,
    prompts: str | None = None,
    run_probe: bool = False,
    k: int | None = DoctorOptions.k,
    max_new_tokens: int = DoctorOptions.max_new_tokens,
    num_prompts: int = DoctorOptions.limit,
    diagnose_always: bool = False,
    device: str = DoctorOptions.device,
    dtype: str = DoctorOptions.dtype,
    allow_unfinished: bool = False,
) -> Report:
    """Check a draft folder against a target as `engine` would serve it.

    Args:
        draft: any draft folder (native checkpoint, SGLang, EAGLE, ModelOpt or speculators layout).
        target: the target (`smollm2`, an HF folder or a .gguf file).
        engine: "sglang", "vllm" or "eagle"; default: the engine the folder's format is made for.
        prompts: prompts file for the live probe (None: built-in prompts).
        run_probe: run the live probe (and the diagnosis when acceptance is low).
        k: draft tokens per verify step in the probe; None: the folder's `speculative_tokens`.
        max_new_tokens: length of each greedy continuation the probe replays.
        num_prompts: how many prompts the probe uses.
        diagnose_always: run the diagnosis even when acceptance is fine.
        device: where the target runs for the probe: "auto" (default) is the GPU when there is one,
            else the CPU (the draft's replay runs on the CPU).
        dtype: the dtype the probe runs target and draft in: the dtype you serve in. "bfloat16"
            (default, what SGLang and vLLM serve a bf16 export in) or "float32" (or "float16").
            bf16 costs acceptance against float32 (seen with vLLM 0.32 CPU on a trained SmolLM2
            draft: accept length 2.12 in bf16, 2.33 in float32), so a float32 probe overstates
            what a bf16 server delivers. The report says which dtype and device it measured.
        allow_unfinished: check a draft whose training did not finish (refused otherwise); the
            report then says so in a `finished` check.
    """
    device, dtype = resolve_device(device), probe_dtype(dtype)
    folder = read_folder(draft)
    k = k or speculative_tokens(folder)
    unfinished = refuse_unfinished(folder.unfinished, draft, allow_unfinished=allow_unfinished)
    facts = target_facts(target)
    interp = interpret(folder, target_num_layers=facts.num_layers)
    engine = engine or (interp.format if interp.format in FORMATS else NATIVE_ENGINE)
    if engine not in FORMATS:
        raise EaglekitError(f"unknown engine {engine!r}", hint=f"use one of {', '.join(FORMATS)}")
    reading = FORMATS[engine].read(interp, target_vocab=facts.vocab_size, target_layers=facts.num_layers)

    @lru_cache(maxsize=1)
    def loaded():
        return load_target(facts.source, device=device, dtype=dtype)

    ctx = Context(
        interp=interp,
        reading=reading,
        facts=facts,
        target_embedding=lambda: loaded().model.get_input_embeddings().weight.detach().cpu(),
    )
    report = Report(
        draft=str(draft),
        target=str(target),
        engine=engine,
        format=interp.label,
        checks=run_checks(ctx),
        notes=list(interp.notes),
        unfinished=unfinished,
    )
    if unfinished:
        report.checks.insert(
            0,
            Check(
                "finished",
                WARN,
                f"the draft is unfinished: {unfinished}; checked anyway (--allow-unfinished)",
                "finish training (--resume) before serving it",
            ),
        )
    if run_probe:
        report.probe = live_probe(ctx, loaded(), prompts, k, max_new_tokens, num_prompts, diagnose_always)
        report.probe.update(dtype=dtype, device=device)
        report.probe["message"] += f" [measured in {dtype} on {device}]"
        report.checks.append(
            Check("probe", report.probe["status"], report.probe["message"], report.probe.get("fix") or "")
        )
    else:  # a draft of random weights passes every static check, so say that acceptance went unmeasured
        report.notes.append(
            "acceptance not measured: these are the static checks only, which a draft of random "
            "weights passes too; `--probe` runs the draft against the target and measures its "
            "accept length (`--probe builtin`, or a prompts file of your workload)"
        )
    return report


def probe_dtype(dtype: str) -> str:
    """The probe's dtype, by its full name ("bf16"/"fp32"/"fp16" accepted); never "auto": the probe
    measures in the dtype the user serves in."""
    if str(dtype) not in DTYPES:
        raise EaglekitError(
            f"unknown probe dtype {dtype!r}", hint="use the dtype you serve in: bfloat16, float32 or float16"
        )
    return dtype_name(dtype)


def live_probe(
    ctx: Context, target, prompts: str | None, k: int, max_new_tokens: int, num_prompts: int, diagnose_always: bool
) -> dict:
    messages = load_prompts(prompts, num_prompts)
    runs = [
        run_target(target.model, target.tokenizer, m, max_new_tokens=max_new_tokens, stop_ids=target.stop_token_ids)
        for m in messages
    ]
    # In the target's dtype (the serving dtype): the replay runs the draft in the same dtype.
    embedding = target.model.get_input_embeddings().weight.detach().cpu()
    read = engine_setup(ctx)
    result = probe(read, runs, embedding, k)
    expected, expected_from = training_tau(ctx.interp.folder.manifest, k)
    out = {
        "k": k,
        "prompts": len(runs),
        "max_new_tokens": max_new_tokens,
        "method": "greedy chain replay",
        **result.to_dict(),
        "expected_tau": expected,
        "expected_from": expected_from,
    }
    tau = result.tau
    if tau is None:
        out.update(status=FAIL, message=f"the draft cannot run as {ctx.engine} reads it: {result.error}")
    elif tau < 1.10:
        out.update(
            status=FAIL,
            message=f"accept length {tau:.2f}: the target accepts almost no draft token "
            f"(per position {result.per_position})",
        )
    elif expected is not None and tau - 1 < 0.25 * (expected - 1):
        out.update(
            status=FAIL, message=f"accept length {tau:.2f}, a small part of what training predicts ({expected:.2f})"
        )
    elif expected is not None and tau - 1 < 0.5 * (expected - 1):
        out.update(status=WARN, message=f"accept length {tau:.2f}, far below what training predicts ({expected:.2f})")
    else:
        out.update(
            status=PASS,
            message=f"accept length {tau:.2f}, per position {result.per_position}"
            + (f" (training predicts {expected:.2f})" if expected is not None else ""),
        )
    if out["status"] != PASS or diagnose_always:
        out["diagnosis"] = diagnose(ctx, read, result, runs, embedding, k, expected)
        if out["status"] != PASS:
            cause = out["diagnosis"].get("cause")
            out["message"] += (". Cause: " if cause else ". ") + out["diagnosis"]["message"]
            out["fix"] = out["diagnosis"]["fix"]
    return out
