"""`eaglekit bench`: tau, acceptance and speedup of a draft in eaglekit's engine, against plain
decoding in the same engine and HF `generate`."""

from __future__ import annotations

import argparse
import shlex
import sys

from eaglekit.engine.cli import add_engine_args, sampling_from, spec_from


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure tau, per-position acceptance and speedup of a draft",
                       description=__doc__)
    p.add_argument("--target", default="smollm2", help="smollm2, an HF model folder or a .gguf file")
    p.add_argument("--draft", required=True, help="a draft checkpoint folder, `oracle` (replays the target's "
                   "greedy answer: engine overhead) or `random` (random weights: draft cost, no acceptance)")
    p.add_argument("--prompts", help="JSONL ({id, turns} / {messages} / {prompt}) or an `eaglekit prompts` folder "
                   "(default: a small built-in set)")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    add_engine_args(p)
    p.add_argument("--sweep", action="store_true", help="try several chain lengths and tree shapes; report the fastest")
    p.add_argument("--no-hf", dest="hf", action="store_false", help="skip HF generate")
    p.add_argument("--hf-prompts", type=int, default=8,
                   help="HF generate on the first N prompts only (all their turns), compared with plain and "
                   "speculative decoding on the same prompts; HF runs ~40x slower than the engine, so all of "
                   "MT-bench would cost minutes (0: all prompts)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per method")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-unfinished", action="store_true",
                   help="bench a draft whose training did not finish (refused otherwise; the results say so)")
    p.add_argument("--json", help="also write the results JSON here")
    p.add_argument("--out", default="runs/bench", help="output folder (results.json, report.md, plot, manifest)")
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    """The command as typed, or rebuilt from the options when bench runs inside `eaglekit run`."""
    if sys.argv[1:2] == ["bench"]:
        return shlex.join(["eaglekit", *sys.argv[1:]])
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("func", "command") and v is not None]
    return shlex.join(["eaglekit", "bench", *flags])


def run(args: argparse.Namespace) -> int:
    from eaglekit.bench.benchmark import BenchConfig, benchmark, write_outputs
    from eaglekit.bench.report import markdown

    cfg = BenchConfig(target=args.target, draft=args.draft, prompts=args.prompts, spec=spec_from(args),
                      sampling=sampling_from(args), max_new_tokens=args.max_new_tokens, limit=args.limit,
                      sweep=args.sweep, hf=args.hf, hf_prompts=args.hf_prompts or None, device=args.device, dtype=args.dtype, runner=args.runner,
                      graphs=args.graphs, compile=args.compile, max_len=args.max_len, warmup=args.warmup,
                      seed=args.seed, allow_unfinished=args.allow_unfinished)
    result = benchmark(cfg, command=command_line(args))
    write_outputs(result, cfg, args.out, args.json)
    print(markdown(result))
    if result.get("plot_note"):
        print(result["plot_note"])
    print(f"wrote {args.out}/results.json, report.md, manifest.json")
    return 0
