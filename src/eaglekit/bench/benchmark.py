"""`eaglekit bench` from start to finish: load, measure, summarize, write the output folder.

out/manifest.json   stage "bench": config, target fingerprint, inputs, counts
out/results.json    summary + per prompt + per turn (+ sweep: each shape on the first --sweep-prompts
                    prompts; the summary is the chosen shape's on all, and says why: `shape_choice`)
out/report.md       the markdown table
out/acceptance.png  acceptance per position and tau per prompt (needs matplotlib)

With the plain fallback on (the default), the chosen shape also runs speculating throughout, in the same
engine on the same turns (`summary.throughout`): with the fallback, stretches where the draft is weak run
as plain steps and leave the tau, so only this tau is the draft's own accept length.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch

from eaglekit.artifacts import (
    BENCH_RESULTS,
    atomic_path,
    clear_folder,
    has_content,
    refuse_existing,
    sha256_file,
    write_json,
    write_manifest,
    writer_lock,
)
from eaglekit.bench.options import BenchOptions
from eaglekit.bench.prompts import load_bench_prompts, prompt_categories
from eaglekit.bench.report import greedy_match_note, markdown, plot, shape_choice, summarize, turn_records, verdict
from eaglekit.bench.run import Method, conversation_ids, run_turns
from eaglekit.engine import DraftRunner, Engine, OracleDrafter, SpecConfig
from eaglekit.engine.profile import cycle_profile
from eaglekit.errors import EaglekitError
from eaglekit.formats.detect import FORMAT_LABELS, detect_format
from eaglekit.formats.load import load_draft_for, random_draft_for, read_draft_folder
from eaglekit.runtime import make_target_runner
from eaglekit.targets.load import load_target, resolve_device

log = logging.getLogger(__name__)

STAND_INS = ("oracle", "random")  # --draft values that are not a folder
THROUGHOUT = " throughout"  # the label's suffix of a shape run without the plain fallback


def throughout(method: Method) -> Method:
    """The same engine speculating throughout: the tau the plain fallback cannot select."""
    return Method(method.label + THROUGHOUT, method.engine, method.oracle, plain_fallback=False)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def cache_slots(cfg: BenchOptions, tokenizer, prompts, specs) -> int:
    """Enough slots for the longest conversation: every turn's request + answers + draft headroom."""
    if cfg.cache_slots:
        return cfg.cache_slots
    longest = 0
    for prompt in prompts:
        placeholder = ["x"] * len(prompt.turns)
        ids = conversation_ids(tokenizer, prompt, placeholder)[-1]
        longest = max(longest, len(ids) + len(prompt.turns) * (cfg.max_new_tokens + 32))
    headroom = max(spec.headroom for spec in specs)
    return -(-(longest + headroom) // 128) * 128


@contextmanager
def bench_out(cfg: BenchOptions) -> Iterator[Path]:
    """Hold --out as its only writer from before the bench to its last file: a second `bench --out X`
    is refused at once, not after minutes of benching whose results it then threw away; so are
    another stage's folder and a finished bench's without --overwrite. A bench that fails leaves no
    empty folder it made."""
    out = Path(cfg.out)
    created = not out.exists()
    with writer_lock(out, stage="bench"):
        try:
            refuse_existing(out, overwrite=cfg.overwrite)
            yield out
        finally:
            if created and out.is_dir() and not has_content(out):
                out.rmdir()


def benchmark(cfg: BenchOptions, command: str = "") -> dict:
    """Run the benchmark and return the results (see module docstring for the files)."""
    spec, sampling = cfg.spec_config(), cfg.sampling()  # bad options fail first
    if cfg.draft in STAND_INS and spec.plain_fallback:
        # `random` measures the draft's cost with no acceptance and `oracle` the engine at full
        # acceptance: both are about the cycle, and with the fallback a random draft's run would be
        # mostly plain steps (and measure those). Off, and recorded so in the results' config.
        log.info("bench: --draft %s speculates throughout (no plain fallback): it measures the cycle", cfg.draft)
        spec = replace(spec, plain_fallback=False)
    if cfg.hf_prompts < 0:
        raise EaglekitError(
            f"--hf-prompts {cfg.hf_prompts}: a number of prompts is >= 0",
            hint="0 runs HF generate on every prompt, --no-hf on none",
        )
    folder = None
    if cfg.draft not in STAND_INS:  # a wrong path or an unfinished draft fails before the target loads
        folder = read_draft_folder(cfg.draft, allow_unfinished=cfg.allow_unfinished)
    prompts = load_bench_prompts(cfg.prompts, cfg.limit)
    device = resolve_device(cfg.device)
    target = load_target(cfg.target, device=device, dtype=cfg.dtype)
    shapes = cfg.sweep_specs(device) if cfg.sweep else (spec,)
    if not cfg.sweep_shapes and spec.label() not in {shape.label() for shape in shapes}:
        # the default sweep also tries the shape asked for (--mode, --k, ...); --sweep-shapes names them all
        shapes = (*shapes, spec)
    # The sweep's shapes take the run's fallback setting (a SpecConfig built in code has it off).
    specs = [replace(shape, plain_fallback=spec.plain_fallback) for shape in shapes]
    draft = None
    if cfg.draft == "random":
        draft = random_draft_for(target.model, device)
    elif folder is not None:
        draft = load_draft_for(folder, target, device)
    max_len = cache_slots(cfg, target.tokenizer, prompts, specs)
    aux = list(draft.config.aux_layer_ids) if draft is not None else []
    runner = make_target_runner(target.model, max_len=max_len, aux_layer_ids=aux, runner=cfg.runner)
    log.info("bench: %d prompts, %s runner, %d cache slots, %s", len(prompts), runner.kind, max_len, device)

    def engine_for(spec: SpecConfig):
        if draft is None:
            drafter = OracleDrafter([], spec=spec, vocab_size=runner.vocab_size, max_len=max_len, device=device)
        else:
            drafter = DraftRunner(draft, spec=spec, sampling=sampling, max_len=max_len)
        engine = Engine(
            runner,
            drafter=drafter,
            spec=spec,
            sampling=sampling,
            stop_token_ids=target.stop_token_ids,
            graphs=cfg.graphs,
            compile=cfg.compile,
        )
        return engine, (drafter if draft is None else None)

    start = time.time()
    methods = [Method(spec.label(), *engine_for(spec)) for spec in specs]
    engines = [m.engine for m in methods]
    categories = prompt_categories(cfg.prompts)[0]
    run = dict(max_new_tokens=cfg.max_new_tokens, hf_prompts=cfg.hf_prompts, seed=cfg.seed)
    sweep, choice, best = None, None, 0
    both = spec.plain_fallback  # the fallback's run and one speculating throughout (stand-ins have it off)
    if cfg.sweep:
        # Every shape on the first few prompts; then the chosen one on all of them, in the same engines
        # (the target loads once, each shape's cycle compiles once). Where the few are all the prompts,
        # the sweep's own runs are the bench (HF generate then runs in them).
        tried = prompts[: cfg.sweep_prompt_count]
        whole = len(tried) == len(prompts)
        log.info("bench: sweep of %d shapes on %d of %d prompts", len(specs), len(tried), len(prompts))
        sweep_turns, sweep_timing = run_turns(
            engines[0], methods, target, tried, hf=cfg.hf and whole, warmup=cfg.warmup, **run
        )
        sweep = [
            {
                **summarize(sweep_turns, spec.label(), spec.max_depth, sampling.greedy, categories)["summary"],
                "config": spec.to_dict(),
            }
            for spec in specs
        ]
        best = max(range(len(specs)), key=lambda i: sweep[i]["spec_tok_s"])
        choice = shape_choice(sweep, best, sweep_timing)
        log.info("bench: chose %s", choice["why"])
        if whole:
            turns, timing = sweep_turns, sweep_timing
        else:
            log.info("bench: %s on all %d prompts", specs[best].label(), len(prompts))
            chosen = [methods[best], throughout(methods[best])] if both else [methods[best]]
            turns, timing = run_turns(
                engines[0], chosen, target, prompts, hf=cfg.hf, warmup=cfg.warmup if cfg.hf else 0, **run
            )  # the engines are warm
    else:
        runs = [*methods, throughout(methods[0])] if both else methods
        turns, timing = run_turns(engines[0], runs, target, prompts, hf=cfg.hf, warmup=cfg.warmup, **run)
    label = specs[best].label()
    result = summarize(turns, label, specs[best].max_depth, sampling.greedy, categories)
    if both and label + THROUGHOUT in turns[0].spec:
        result["summary"]["throughout"] = throughout_summary(
            summarize(turns, label + THROUGHOUT, specs[best].max_depth, sampling.greedy, categories)["summary"]
        )
    elif both:  # a sweep whose few prompts were all of them: its runs are the bench
        result["summary"]["throughout"] = None
    if choice is not None:
        result["summary"]["shape_choice"] = choice
    profile = slow_cycle_profile(engines[best], result["summary"], turns[0].ids, cfg.max_new_tokens)
    result["summary"]["verdict"] = verdict(result["summary"], profile)
    result["cycle_profile"] = profile
    log.info(result["summary"]["verdict"])
    result["summary"].update(
        device=device_name(device),
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        command=command,
        config={
            **cfg.to_dict(),
            "plain_fallback": spec.plain_fallback,
            "spec": specs[best].to_dict(),
            "runner": runner.kind,
            "cache_slots": max_len,
            "graphs": engines[best].graphs,
            "compile": engines[best].compile,
            "dtype": str(runner_dtype(runner)),
        },
        torch=torch.__version__,
        seconds=round(time.time() - start, 1),
    )
    result["summary"]["timing"] = timing
    result["summary"]["draft_format"] = FORMAT_LABELS[detect_format(folder.config)] if folder else cfg.draft
    result["summary"]["unfinished_draft"] = folder.unfinished if folder else None
    result["config"] = {
        "target": cfg.target,
        "draft": cfg.draft,
        "sampling": "greedy"
        if sampling.greedy
        else f"T={sampling.temperature} top_p={sampling.top_p} top_k={sampling.top_k}",
        "max_new_tokens": cfg.max_new_tokens,
    }
    if cfg.sweep:
        result["sweep"] = sweep
    result["turns"] = turn_records(turns)
    result["target_fingerprint"] = target.fingerprint()
    note = greedy_match_note(result)
    if note:
        (log.warning if note.bug else log.info)(note.text.replace("**", ""))
    return result


def throughout_summary(summary: dict) -> dict:
    """What the run speculating throughout adds to the summary: the draft's own tau, per position and
    per category, and that run's speedup and cycle."""
    keep = ("tau", "speedup", "spec_tok_s", "per_position_acceptance", "efficiency", "cycles", "greedy_match")
    cats = summary["by_category"]
    return {
        **{k: summary[k] for k in keep},
        "cycle_plain_steps": (summary.get("cycle") or {}).get("plain_steps"),
        "by_category": {name: {"tau": c["tau"], "speedup": c["speedup"]} for name, c in cats.items()} if cats else None,
    }


def slow_cycle_profile(engine: Engine, summary: dict, prompt_ids: list[int], max_new_tokens: int) -> dict | None:
    """Where the cycle's time goes, when speculation was slower than plain decoding and the cycle
    is the fused greedy one in CUDA graphs (elsewhere the split would measure eager launches)."""
    if summary["speedup"] >= 1 or not engine.sampling.greedy or not engine.graphs:
        return None
    return cycle_profile(engine, prompt_ids, max_new_tokens)


def runner_dtype(runner) -> torch.dtype:
    return next(runner.parameters()).dtype


def write_outputs(result: dict, cfg: BenchOptions, out: str | Path) -> dict:
    """Write results.json, report.md, acceptance.png and manifest.json (last) into `out`, whose
    writer lock the caller holds (`bench_out`). An earlier result (--overwrite) is moved aside and
    deleted only once the new manifest is in place; a write that fails puts it back (`writer_lock`)."""
    out = Path(out)
    clear_folder(out)
    why_no_plot = plot(result, out / "acceptance.png")
    if why_no_plot:
        log.warning(why_no_plot)
    result["plot"] = None if why_no_plot else "acceptance.png"
    result["plot_note"] = why_no_plot
    write_json(out / BENCH_RESULTS, result)
    text = markdown(result)  # the drift warning, if any, heads it
    unfinished = result["summary"].get("unfinished_draft")
    if unfinished:  # first of all: what was measured is not a finished draft
        text = f"**Unfinished draft** (benched with --allow-unfinished): {unfinished}\n\n" + text
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text(text + "\n")
    s = result["summary"]
    inputs = {}
    if cfg.prompts and Path(cfg.prompts).is_file():
        inputs["prompts"] = {"path": str(cfg.prompts), "sha256": sha256_file(cfg.prompts)}
    if cfg.draft not in STAND_INS:
        inputs["draft"] = {
            "path": str(cfg.draft),
            "format": s["draft_format"],
            "sha256": {f.name: sha256_file(f) for f in sorted(Path(cfg.draft).glob("*.safetensors"))},
        }
    return write_manifest(
        out,
        stage="bench",
        config=s["config"],
        target=result["target_fingerprint"],
        inputs=inputs,
        counts={"prompts": s["prompts"], "turns": s["turns"], "cycles": s["cycles"]},
        extra={
            "summary": {
                "throughout": s.get("throughout"),  # None: speculating throughout already, or a stand-in
                **{
                    k: s[k]
                    for k in (
                        "tau",
                        "speedup",
                        "per_prompt_speedup",
                        "baseline_tok_s",
                        "spec_tok_s",
                        "hf_tok_s",
                        "greedy_match",
                        "device",
                        "date",
                        "timing",
                    )
                },
            },
            "unfinished_draft": s.get("unfinished_draft"),
        },
    )
