"""`eaglekit speculate`: answer one prompt with speculative decoding and print the text and tau,
beside plain decoding of the same prompt. Its options: `eaglekit.engine.options`; --target defaults
to the target the draft records (its manifest), so a run's draft runs on that run's target."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from eaglekit.engine.options import GROUPS, SpeculateOptions
from eaglekit.errors import EaglekitError
from eaglekit.options import add_options, option, options_from_args
from eaglekit.targets.options import TARGET_HELP
from eaglekit.targets.source import DEFAULT_TARGET

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SpeculateCommand(SpeculateOptions):
    """`speculate`'s options: the engine's, with a --target that follows the draft unless given."""

    target: str | None = option(
        None,
        f"{TARGET_HELP} (default: the target the draft was made for, as its manifest "
        f"records; {DEFAULT_TARGET} for a draft that records none)",
        group="main",
    )


def register(sub) -> None:
    p = sub.add_parser("speculate", help="answer one prompt with speculative decoding (prints text, tau, tok/s)")
    p.add_argument("prompt", help="the user message")
    add_options(p, SpeculateCommand, GROUPS)
    p.set_defaults(func=run)


def recorded_target_spec(folder) -> str | None:
    """The --target a draft folder was made with: a training run's manifest records it, an export's
    or import's carries its source's manifest (`source_manifest`); a fingerprint alone names only
    the default target. None when the folder records no target at all."""
    manifest = folder.manifest or {}
    for m in (manifest, manifest.get("source_manifest") or {}):
        spec = (m.get("config") or {}).get("target") if isinstance(m, dict) else None
        if isinstance(spec, str) and spec:
            return spec
    fingerprint = folder.recorded_target or {}
    return DEFAULT_TARGET if fingerprint.get("name") == DEFAULT_TARGET else None


def draft_target(folder) -> str:
    """Where the draft's own target is now: as recorded (absolute, or relative to here), else
    relative to a folder above the draft (the run folder, when the command ran from elsewhere).
    `load_draft_for`'s fingerprint check then refuses a target that is not the recorded one."""
    spec = recorded_target_spec(folder)
    if spec is None:
        if folder.recorded_target:  # a fingerprint without a path: which file it was is unknown
            raise EaglekitError(
                f"draft {folder.path} was made for target {folder.recorded_target.get('name')!r} "
                "and records no path to it",
                hint="pass that target with --target",
            )
        log.info("draft %s records no target: speculating on %s", folder.path, DEFAULT_TARGET)
        return DEFAULT_TARGET
    if spec == DEFAULT_TARGET or Path(spec).expanduser().is_absolute() or Path(spec).exists():
        return spec
    for above in Path(folder.path).resolve().parents:
        if (above / spec).exists():
            return str(above / spec)
    raise EaglekitError(
        f"draft {folder.path} was made for target {spec}, which is not there (relative to here or "
        "to a folder above the draft)",
        hint="pass that target with --target",
    )


def run(args: argparse.Namespace) -> int:
    from eaglekit.engine import DraftRunner, Engine
    from eaglekit.formats.load import load_draft_for, random_draft_for, read_draft_folder
    from eaglekit.runtime import make_target_runner
    from eaglekit.targets.chat import prompt_ids
    from eaglekit.targets.load import load_target, resolve_device

    opts = options_from_args(SpeculateCommand, args)
    # Bad options, a wrong path or an unfinished draft fail before the target loads.
    spec, sampling = opts.spec_config(), opts.sampling()
    folder = (
        None
        if opts.draft == "random"
        else read_draft_folder(opts.draft, allow_unfinished=opts.allow_unfinished, stand_ins=("random",))
    )
    if opts.target is None:
        opts = replace(opts, target=draft_target(folder) if folder is not None else DEFAULT_TARGET)
        if folder is not None:
            print(f"[target: {opts.target}, the draft's own (--target to override)]")
    device = resolve_device(opts.device)
    target = load_target(opts.target, device=device, dtype=opts.dtype)
    if folder is None:
        draft = random_draft_for(target.model, device)
    else:
        draft = load_draft_for(folder, target, device)  # refuses a target other than the one the draft records
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": args.prompt}])
    max_len = opts.cache_slots or -(-(len(ids) + opts.max_new_tokens + spec.headroom) // 128) * 128
    runner = make_target_runner(
        target.model, max_len=max_len, aux_layer_ids=list(draft.config.aux_layer_ids), runner=opts.runner
    )
    engine = Engine(
        runner,
        drafter=DraftRunner(draft, spec=spec, sampling=sampling, max_len=max_len),
        spec=spec,
        sampling=sampling,
        stop_token_ids=target.stop_token_ids,
        graphs=opts.graphs,
        compile=opts.compile,
    )
    engine.warmup(speculative=True)  # compile and capture apart from the timings (no-op without graphs)
    engine.warmup(speculative=False)
    gen = engine.generate(ids, opts.max_new_tokens, seed=opts.seed)
    print(target.tokenizer.decode(gen.tokens, skip_special_tokens=True))
    # tok/s counts the plain fallback's tokens too, so the line says how many there were
    fallback = (
        f", plain_tokens {gen.plain_tokens}, fallbacks {gen.fallbacks} (plain steps where the cycles did not "
        "pay; --no-plain-fallback speculates throughout)"
        if gen.fallbacks or gen.plain_tokens
        else ""
    )
    print(
        f"\n[{len(gen.tokens)} tokens, {len(gen.tokens) / gen.seconds:.1f} tok/s, tau {gen.tau:.2f}, "
        f"{spec.label()}, {runner.kind} runner, {gen.finish_reason}{fallback}]"
    )
    if not opts.no_plain:  # the same prompt decoded plainly, so the gain (or loss) is in plain sight
        plain = engine.generate(ids, opts.max_new_tokens, speculative=False, seed=opts.seed)
        plain_tok_s, spec_tok_s = len(plain.tokens) / plain.seconds, len(gen.tokens) / gen.seconds
        same = "same tokens" if plain.tokens == gen.tokens else "other tokens (sampling, or bf16 near-ties)"
        print(
            f"[plain decoding: {len(plain.tokens)} tokens, {plain_tok_s:.1f} tok/s; speculation "
            f"{spec_tok_s / plain_tok_s:.2f}x ({same}; one prompt, one run each: `eaglekit bench` measures)]"
        )
    if folder is not None and folder.unfinished:
        print(f"[unfinished draft: {folder.unfinished}]")
    return 0
