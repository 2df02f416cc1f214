"""Benchmark the generate stage: eaglekit's batch decoder against Hugging Face `generate`.

Both backends answer the same prompts (a hash-chosen mix of ../shared/data/train) with the same
target, batch size, greedy decoding and max new tokens, in the same process, through the same
stage code (`eaglekit.data.regenerate`, shards written). Each backend is warmed up first; the
decoder's build (torch.compile + CUDA-graph capture) is reported separately.

GPU (from the repo root, after `. scripts/gpu/setup.sh`; the prompts carried as .device/prompts,
made here with `mkdir -p .device/prompts && cp ../shared/data/train/*.jsonl .device/prompts/`):
    python scripts/gpu/bench_generate.py --out $OUT
CPU smoke run (tiny target, a few prompts):
    python scripts/gpu/bench_generate.py --smoke --target TINY_DIR --prompts FILE --out /tmp/bench

Writes $OUT/bench_generate.json (figures, environment, command) and the conversations of each
backend under $OUT/runs/; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from eaglekit.artifacts import sha256_json
from eaglekit.data.generators import EngineGenerator, HFGenerator, Sampling
from eaglekit.data.local_backend import LocalBackend
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.data.records import order_key
from eaglekit.data.regenerate import GenerateConfig, generate_conversations
from eaglekit.errors import EaglekitError
from eaglekit.target import load_target
from eaglekit.target.chat import prompt_ids

REPO = Path(__file__).resolve().parents[2]
# ../shared/data/train here; on the GPU machine a copy carried under .device/prompts (git-ignored).
PROMPT_DIRS = (REPO.parent / "shared/data/train", REPO / "shared/data/train", REPO / ".device/prompts")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=os.environ.get("EAGLEKIT_SMOLLM2_DIR", "smollm2"))
    p.add_argument("--prompts", default=os.environ.get("EAGLEKIT_BENCH_PROMPTS"),
                   help="prompt file or folder (default: ../shared/data/train)")
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--backends", default="engine,hf", help="comma-separated: engine, hf")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on GPU, fp32 on CPU")
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--smoke", action="store_true", help="CPU, 8 prompts, batch 4, 16 new tokens")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.num_prompts, args.batch_size, args.max_new_tokens = "cpu", 8, 4, 16
    return args


def choose_prompts(location: str | None, n: int):
    """n prompts, a hash-ordered mix of all the sources in the folder (the same every run)."""
    if location is None:
        location = next((str(d) for d in PROMPT_DIRS if d.is_dir()), None)
        if location is None:
            raise EaglekitError(f"no prompts found in {', '.join(map(str, PROMPT_DIRS))}",
                                hint="pass --prompts FILE_OR_FOLDER")
    report = read_source(SourceSpec.parse(location))
    if report.malformed:
        raise EaglekitError(f"{location}: malformed records, e.g. {report.malformed[0]}", hint="check the prompts")
    chosen = sorted(report.prompts, key=lambda p: order_key(p, 0))[:n]
    return location, chosen


def environment(device: str) -> dict:
    import transformers

    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
           "transformers": transformers.__version__, "python": sys.version.split()[0],
           "command": " ".join(shlex.quote(a) for a in sys.argv)}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_count"] = torch.cuda.device_count()
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


def run_backend(name: str, target, prompts_file: Path, out: Path, args, longest: int) -> dict:
    """Warm the backend up, then regenerate every prompt with it; return its figures."""
    sampling = Sampling()  # greedy: both backends pick the same tokens up to numerics
    start = time.perf_counter()
    if name == "engine":
        generator = EngineGenerator(target.model, target.stop_token_ids, sampling, batch_size=args.batch_size)
        generator.prepare(longest, args.max_new_tokens)  # compile + capture for the longest prompt
    elif name == "hf":
        generator = HFGenerator(target.model, target.stop_token_ids, sampling)
    else:
        raise EaglekitError(f"unknown backend {name!r}", hint="use engine and/or hf")
    generator.generate([[target.stop_token_ids[0]] * 8] * args.batch_size, 4)  # warm-up batch
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    build = time.perf_counter() - start
    backend = LocalBackend(target.tokenizer, generator, max_new_tokens=args.max_new_tokens,
                           batch_size=args.batch_size, context_length=10**9)
    manifest = generate_conversations(str(prompts_file), out, backend=backend, target_fp=target.fingerprint(),
                                      config=GenerateConfig(max_new_tokens=args.max_new_tokens), overwrite=True)
    speed = manifest["throughput_last_run"]
    counts = manifest["counts"]
    return {"backend": name, "batch_size": args.batch_size, "prompts": counts["conversations"],
            "answer_tokens": counts["answer_tokens"], "seconds": speed["seconds"],
            "prompts_per_s": speed["prompts_per_s"], "tokens_per_s": speed["tokens_per_s"],
            "build_and_warmup_s": round(build, 2), "finish_reason": counts["finish_reason"],
            "decoder_slots": getattr(generator, "max_len", None)}


def answers(folder: Path) -> dict[str, str]:
    from eaglekit.features.conversations import read_conversations

    rows, _ = read_conversations(folder)
    return {r["id"]: r["messages"][-1]["content"] for r in rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    location, prompts = choose_prompts(args.prompts, args.num_prompts)
    prompts_file = out / "bench_prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(p.to_json()) + "\n" for p in prompts))
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    longest = max(len(prompt_ids(target.tokenizer, p.messages())) for p in prompts)
    results = {}
    for name in [b for b in args.backends.split(",") if b]:
        results[name] = run_backend(name, target, prompts_file, out / "runs" / name, args, longest)
        print(json.dumps(results[name]), flush=True)
    report = {"bench": "generate", "smoke": args.smoke, "environment": environment(args.device),
              "target": target.fingerprint(), "dtype": str(target.model.dtype), "device": args.device,
              "prompts": {"from": location, "count": len(prompts), "longest_prompt_tokens": longest,
                          "hash": sha256_json([p.to_json() for p in prompts])},
              "config": {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "sampling": "greedy"},
              "results": results}
    if "engine" in results and "hf" in results:
        a, b = answers(out / "runs" / "engine"), answers(out / "runs" / "hf")
        report["speedup_engine_over_hf"] = round(results["engine"]["tokens_per_s"] / results["hf"]["tokens_per_s"], 2)
        report["identical_answers"] = round(sum(a[k] == b.get(k) for k in a) / max(len(a), 1), 3)
    (out / "bench_generate.json").write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    env = report["environment"]
    print(f"\ngenerate benchmark: {report['target']['name']} ({report['dtype']}) on {env.get('gpu', 'cpu')}, "
          f"{report['prompts']['count']} prompts, batch {report['config']['batch_size']}, "
          f"max {report['config']['max_new_tokens']} new tokens, greedy, {env['date']}")
    print(f"{'backend':<8} {'prompts':>7} {'tokens':>9} {'seconds':>8} {'prompts/s':>10} {'tokens/s':>10} {'build s':>8}")
    for r in report["results"].values():
        print(f"{r['backend']:<8} {r['prompts']:>7} {r['answer_tokens']:>9} {r['seconds']:>8.1f} "
              f"{r['prompts_per_s']:>10.2f} {r['tokens_per_s']:>10.0f} {r['build_and_warmup_s']:>8.1f}")
    if "speedup_engine_over_hf" in report:
        print(f"engine / hf tokens/s: {report['speedup_engine_over_hf']:.2f}x; identical answers: "
              f"{100 * report['identical_answers']:.1f} %")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EaglekitError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
