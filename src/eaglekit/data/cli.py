"""`eaglekit prompts build|synthesize` and `eaglekit generate`."""

from __future__ import annotations

import argparse
import logging
import os

from eaglekit.data.options import (
    GROUPS,
    LOCAL_BACKENDS,
    WORKER_SKIP_GROUPS,
    WORKER_SKIPS,
    GenerateOptions,
    PromptsBuildOptions,
    SynthesizeOptions,
)
from eaglekit.errors import EaglekitError
from eaglekit.options import add_options, options_argv, options_from_args
from eaglekit.targets.source import resolve_target

log = logging.getLogger(__name__)


def register(sub) -> None:
    prompts = sub.add_parser("prompts", help="build a prompt set from datasets, or synthesize one with the target")
    psub = prompts.add_subparsers(dest="prompts_command", metavar="ACTION", required=True)

    build = psub.add_parser(
        "build",
        help="read, filter, deduplicate, mix and split prompt sources",
        description="Sources: LOCATION[,weight=W][,format=F][,name=N][,column=C][,records=KEY][,min-chars=N][,max-chars=N]"
        "[,split=S][,subset=S][,validation-fraction=F]; LOCATION is a .jsonl/.json/"
        ".parquet/.txt file, a folder of them, or hf:<dataset>. Formats: auto "
        "(default), turns, sharegpt, openai, alpaca, prompt, text. A source's own "
        "validation-fraction replaces --validation-fraction for its prompts: hold "
        "out the prompts like those served (chat), not a share of the whole mix.",
    )
    add_options(build, PromptsBuildOptions, groups=GROUPS, only=("main",))
    build.set_defaults(func=run_build)

    synth = psub.add_parser("synthesize", help="let the target write prompts (Magpie)")
    add_options(synth, SynthesizeOptions, groups=GROUPS, only=("main",))
    add_local_args(synth)
    synth.set_defaults(func=run_synthesize)

    gen = sub.add_parser("generate", help="the target answers every prompt (local or an OpenAI-compatible server)")
    add_options(gen, GenerateOptions, groups=GROUPS)
    par = gen.add_argument_group("several devices of this host (data parallel; local, engine and hf backends)")
    par.add_argument(
        "--devices",
        action="append",
        help="one worker process per device, e.g. cuda:0,cuda:1 (or cpu,cpu): the prompts are split "
        "round-robin, each worker writes OUT/workers/I, and the parts are merged into --out; "
        "rerun the same command to resume",
    )
    par.add_argument(
        "--worker",
        help="I/N: answer only prompts I, I+N, I+2N, ... of each split (--devices starts these workers itself)",
    )
    gen.set_defaults(func=run_generate)


def add_local_args(parser: argparse.ArgumentParser) -> None:
    """`generate`'s local-generation flags, on a parser of its own backends (`prompts synthesize`)."""
    parser.add_argument(
        "--backend",
        default=GenerateOptions.backend,
        choices=LOCAL_BACKENDS,
        help=f"generate's local backends only (default {GenerateOptions.backend})",
    )
    add_options(parser, GenerateOptions, groups=GROUPS, only=("local",))


def run_build(args: argparse.Namespace) -> int:
    from eaglekit.data.prompts import Filters, build_prompts
    from eaglekit.data.readers import SourceSpec

    tokenizer = None
    if args.target:
        from eaglekit.targets.load import load_tokenizer

        tokenizer = load_tokenizer(resolve_target(args.target))
    manifest = build_prompts(
        [SourceSpec.parse(s) for s in args.source],
        args.out,
        filters=Filters(
            min_chars=args.min_chars, max_chars=args.max_chars, max_tokens=args.max_tokens, max_turns=args.max_turns
        ),
        validation_fraction=args.validation_fraction,
        num_prompts=args.num_prompts,
        seed=args.seed,
        tokenizer=tokenizer,
        strict=args.strict,
        overwrite=args.overwrite,
    )
    c = manifest["counts"]
    print(f"{args.out}: {c['train']} train + {c['validation']} validation prompts, {c['malformed']} malformed skipped")
    for s in c["sources"]:
        print(
            f"  {s['name']}: {s['records']} records, {s['malformed']} malformed, {s['duplicates']} duplicates, "
            f"{s['too_short'] + s['too_long'] + s['too_many_turns']} filtered, {s['taken']} taken"
        )
    return 0


def run_synthesize(args: argparse.Namespace) -> int:
    from eaglekit.data.folder import read_prompt_folder
    from eaglekit.data.generators import EngineSettings, make_generator
    from eaglekit.data.magpie import pre_query_template, synthesize, write_synthesized
    from eaglekit.runtime.sampling import Sampling
    from eaglekit.targets import load_target
    from eaglekit.targets.load import resolve_device

    existing, inputs = None, {}
    if args.top_up:
        manifest, existing = read_prompt_folder(args.top_up)
        inputs = {"top_up": {"folder": args.top_up, "counts": manifest.get("counts", {})}}
    have = sum(len(v) for v in (existing or {}).values())
    need = args.num_prompts - have
    if need < 1:
        raise EaglekitError(
            f"{args.top_up} already holds {have} >= {args.num_prompts} prompts", hint="ask for more with --num-prompts"
        )
    target = load_target(args.target, device=resolve_device(args.device), dtype=args.dtype)
    pre = pre_query_template(target.tokenizer, args.system)
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    stops = sorted(set(target.stop_token_ids) | {pre.end_of_turn_id})
    generator = make_generator(
        args.backend,
        target.model,
        stops,
        sampling,
        seed=args.seed,
        batch_size=args.batch_size,
        engine=EngineSettings.from_args(args),
    )
    new, stats = synthesize(
        target.tokenizer,
        generator,
        pre,
        need,
        existing=[p for v in (existing or {}).values() for p in v],
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        min_chars=args.min_chars,
        max_attempts=args.max_attempts,
        system=args.system,
    )
    config = {
        "method": "magpie",
        "pre_query_template": pre.text,
        "end_of_turn": pre.end_of_turn,
        "sampling": sampling.to_dict(),
        "max_new_tokens": args.max_new_tokens,
        "num_prompts": args.num_prompts,
        "min_chars": args.min_chars,
        "system": args.system,
        "backend": generator.name,
        "validation_fraction": args.validation_fraction,
        "seed": args.seed,
    }
    manifest = write_synthesized(
        args.out,
        new,
        existing=existing,
        stats=stats,
        config=config,
        target_fp=target.fingerprint(),
        inputs=inputs,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    c = manifest["counts"]
    print(
        f"{args.out}: {len(new)} synthesized (+{have} existing) = {c['train']} train + {c['validation']} validation; "
        f"dropped {stats['unfinished']} unfinished, {stats['too_short']} short, {stats['duplicates']} duplicates"
    )
    return 0 if len(new) == need else 1


def run_generate(args: argparse.Namespace) -> int:
    from eaglekit.data.generators import EngineSettings, make_generator
    from eaglekit.data.local_backend import LocalBackend, context_length
    from eaglekit.data.regenerate import GenerateConfig, generate_conversations, load_prompts
    from eaglekit.runtime.sampling import Sampling
    from eaglekit.targets.chat import check_template_masks

    options_from_args(GenerateOptions, args)  # its checks (counts of 1 or more) before anything loads
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    config = GenerateConfig(
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        stop_loops=args.stop_loops,
        splits=tuple(s for s in args.splits.split(",") if s),
        limit=args.limit,
    )
    if args.devices:
        return run_generate_parallel(args, config)
    worker = None
    if args.worker:
        from eaglekit.data.parallel import exit_with_parent, parse_worker

        worker = parse_worker(args.worker)
        exit_with_parent()
    load_prompts(args.prompts, config.splits, config.limit)  # bad or empty prompts fail before any model loads
    EngineSettings.from_args(args).check(args.backend)
    if args.backend == "openai":
        from eaglekit.data.openai_backend import OpenAIBackend, OpenAIClient

        if not args.server_url:
            raise EaglekitError("--backend openai needs --server-url", hint="e.g. --server-url http://127.0.0.1:8000")
        tokenizer, target_fp = target_without_weights(args.target)
        check_template_masks(tokenizer)
        client = OpenAIClient(
            args.server_url,
            api_key=os.environ.get(args.api_key_env),
            timeout=args.timeout,
            max_retries=args.max_retries,
        )
        backend = OpenAIBackend(
            client,
            model=args.model,
            tokenizer=tokenizer,
            max_new_tokens=args.max_new_tokens,
            sampling=sampling,
            seed=args.seed,
            concurrency=args.concurrency,
            context_length=args.context_length,
            check_template=args.check_template,
        )
    elif args.backend == "vllm":
        from eaglekit.data.vllm_backend import vllm_local_backend

        backend, target_fp = vllm_local_backend(args, sampling)
    else:
        from eaglekit.targets import load_target
        from eaglekit.targets.load import resolve_device

        target = load_target(args.target, device=resolve_device(args.device), dtype=args.dtype)
        check_template_masks(target.tokenizer)
        generator = make_generator(
            args.backend,
            target.model,
            target.stop_token_ids,
            sampling,
            seed=args.seed,
            batch_size=args.batch_size,
            engine=EngineSettings.from_args(args),
        )
        backend = LocalBackend(
            target.tokenizer,
            generator,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            context_length=context_length(args.context_length, target.config),
        )
        target_fp = target.fingerprint()
    manifest = generate_conversations(
        args.prompts,
        args.out,
        backend=backend,
        target_fp=target_fp,
        config=config,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
        worker=worker,
    )
    print_generated(args.out, manifest)
    return 0


def run_generate_parallel(args: argparse.Namespace, config) -> int:
    """`--devices`: one `eaglekit generate --worker I/N` process per device, merged into --out."""
    from eaglekit.data.parallel import check_device_flag, generate_parallel, parse_devices
    from eaglekit.targets.chat import check_template_masks

    if args.backend == "openai":
        raise EaglekitError(
            "--devices runs the target on this host; --backend openai sends the prompts to a server",
            hint="a server spreads the work itself: raise --concurrency, or drop --devices",
        )
    if args.backend == "vllm":
        raise EaglekitError(
            "--devices runs one eaglekit worker per device; --backend vllm runs one vLLM engine",
            hint="split the target with --tensor-parallel-size instead, or drop --devices",
        )
    if args.worker:
        raise EaglekitError("--devices and --worker do not go together", hint="--devices starts the workers itself")
    from eaglekit.data.generators import EngineSettings  # after the checks above: it loads transformers

    EngineSettings.from_args(args).check(args.backend)  # before any worker starts
    devices = parse_devices(args.devices)
    check_device_flag(args.device, devices)
    tokenizer, target_fp = target_without_weights(args.target)
    check_template_masks(tokenizer)
    manifest = generate_parallel(
        args.prompts,
        args.out,
        devices=devices,
        worker_argv=worker_argv(args),
        target_fp=target_fp,
        config=config,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
    )
    print_generated(args.out, manifest)
    return 0


def worker_argv(args: argparse.Namespace) -> list[str]:
    """`eaglekit` arguments of a `--devices` worker: every option that decides the content, from
    `GenerateOptions`, none of the parent's own (--devices, --device, --out, --overwrite)."""
    argv = ["-v"] if args.verbose else []
    return argv + ["generate", *options_argv(GenerateOptions, args, skip=WORKER_SKIPS, skip_groups=WORKER_SKIP_GROUPS)]


def target_without_weights(spec: str) -> tuple[object, dict]:
    """The target's tokenizer and fingerprint from its config and tokenizer files (no weights loaded)."""
    from eaglekit.targets.info import load_config
    from eaglekit.targets.load import generation_eos_ids, load_tokenizer, target_fingerprint

    source = resolve_target(spec)
    target_config = load_config(source)
    tokenizer = load_tokenizer(source, generation_eos_ids(source, target_config))
    return tokenizer, target_fingerprint(target_config, tokenizer, source)


def print_generated(out: str, manifest: dict) -> None:
    c = manifest["counts"]
    t = manifest["throughput_last_run"]
    print(
        f"{out}: {c['conversations']} conversations ({c['by_split']}), {c['skipped']} skipped, "
        f"{c['answer_tokens']} answer tokens; this run {t['prompts_per_s']} prompts/s, {t['tokens_per_s']} tokens/s"
    )
