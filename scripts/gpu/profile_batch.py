"""Where the batch decoder's time goes (the generate stage's engine): one decode step, one refill, one round.

For each attention variant, builds the stage's decoder (`data.batch_decoder.batch_runner` + `BatchDecoder`,
as `EngineGenerator` does), fills every row with a real prompt, then times with CUDA events:
    step     one replay of the captured decode step, all rows live (ms)
    refill   the eager prefill of `--refill` prompts into free rows (ms), and its kernel count
    graphed  the graphed refill of those prompts, fresh and resumed (all but 32 tokens cached):
             a bucket's first use (its capture) and a replay (ms), and the replay's top kernels
    round    one `serve` round's GPU work as the stage queues it: `chunk` steps + the refill of the
             rows that end in a round at the measured answer length (ms)
and prints the tokens/s these imply beside the figures, with the top kernels of a refill and a step
(torch.profiler). Prompts: first user turns from a prompt folder (like bench_generate.py).

GPU:  . scripts/gpu/setup.sh && python scripts/gpu/profile_batch.py --target $EAGLEKIT_SMOLLM2_DIR \
          --prompts /root/prompts/train --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from eaglekit.data.batch_decoder import BatchDecoder, Request, batch_runner
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.data.records import order_key
from eaglekit.runtime.sampling import Sampling
from eaglekit.targets import load_target
from eaglekit.targets.chat import prompt_ids
from eaglekit.targets.source import DEFAULT_TARGET


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=os.environ.get("EAGLEKIT_SMOLLM2_DIR", DEFAULT_TARGET))
    p.add_argument("--prompts", required=True)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--cache-slots", "--slots", dest="slots", type=int, default=2048)
    p.add_argument("--attention", default="flex,sdpa")
    p.add_argument("--refill", type=int, default=32, help="prompts per timed refill")
    p.add_argument("--answer-tokens", type=float, default=300, help="mean answer length (rows ending per step)")
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--out", default=os.environ.get("OUT", "profile-out"))
    return p.parse_args(argv)


def timed(fn, repeats: int) -> float:
    """Mean ms of fn() over repeats (CUDA events, after one untimed call)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def top_kernels(fn, n: int = 12) -> tuple[int, list[str]]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    count = sum(e.count for e in events)
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    return count, [f"{e.device_time_total / 1e3:8.3f} ms  x{e.count:<5d} {e.key[:90]}" for e in events[:n]]


def graphed_refills(runner, ids: list[list[int]], rows: int) -> dict:
    """The stage's graphed refills (`--refill graphs`): for fresh prompts and for resumed ones (a turn
    whose row caches its first tokens, as a conversation's next turn), the first use of a bucket (its
    capture: a warm-up run, the capture, a sync) and a replay, in ms, with the replay's top kernels."""
    dec = BatchDecoder(runner, sampling=Sampling(), graphs=True, compile=False, refill="graphs")
    dec.set_stop_ids([-5])
    prompts = [i for i in ids if len(i) >= 96][:rows]
    if len(prompts) < 2:
        return {"skipped": f"{len(prompts)} prompts of 96+ tokens"}
    shapes = {
        "fresh": [0] * len(prompts),  # the whole prompt prefilled
        "resumed": [len(i) - 32 for i in prompts],
    }  # all but its last 32 tokens cached
    out = {}
    for name, cached in shapes.items():
        requests = [Request(i, 512) for i in prompts]
        refill = lambda: dec._prefill(list(range(len(prompts))), requests, cached)  # noqa: E731, B023
        torch.cuda.synchronize()
        start = time.perf_counter()
        refill()  # the bucket's first use: captured
        torch.cuda.synchronize()
        first_ms = 1000 * (time.perf_counter() - start)
        count, top = top_kernels(refill)
        out[name] = {
            "prompts": len(prompts),
            "new_tokens": sum(len(i) - c for i, c in zip(prompts, cached)),
            "graphs": sorted(map(list, dec.refill_steps)),
            "first_use_ms": round(first_ms, 1),
            "replay_ms": round(timed(refill, 10), 3),
            "kernels": count,
            "top": top,
        }
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    target = load_target(args.target, device="cuda", dtype="auto")
    report = read_source(SourceSpec.parse(args.prompts))
    prompts = sorted(report.prompts, key=lambda p: order_key(p, 0))
    ids = [
        prompt_ids(target.tokenizer, [{"role": "user", "content": p.turns[0]}]) for p in prompts[: 4 * args.batch_size]
    ]
    ids = [i for i in ids if len(i) <= 1024][: 2 * args.batch_size]
    lengths = sorted(map(len, ids))
    result = {
        "target": args.target,
        "batch_size": args.batch_size,
        "slots": args.slots,
        "prompt_tokens_median": lengths[len(lengths) // 2],
        "variants": {},
    }
    print(f"prompts: {len(ids)}, median {result['prompt_tokens_median']} tokens", flush=True)
    for attention in args.attention.split(","):
        start = time.perf_counter()
        runner = batch_runner(target.model, max_len=args.slots, batch_size=args.batch_size, attention=attention)
        dec = BatchDecoder(runner, sampling=Sampling(), graphs=True, compile=True, chunk=args.chunk)
        built = time.perf_counter() - start
        dec.set_stop_ids([-5])  # no stop: every row stays live while timed
        B = args.batch_size
        dec.refill(list(range(B)), [Request(i, 512) for i in ids[:B]])
        torch.cuda.synchronize()
        step_ms = timed(dec.step, 50)
        step_kernels, step_top = top_kernels(dec.step)
        spare = ids[B : B + args.refill]
        rows = list(range(args.refill))
        refill = lambda: dec.refill(rows, [Request(i, 512) for i in spare])  # noqa: E731, B023 (timed at once)
        refill_ms = timed(refill, 5)
        refill_kernels, refill_top = top_kernels(refill)
        graphed = graphed_refills(runner, ids, args.refill)
        per_round = B * args.chunk / args.answer_tokens  # rows that end (and are refilled) per round
        round_ms = args.chunk * step_ms + per_round / args.refill * refill_ms
        v = {
            "built_s": round(built, 1),
            "step_ms": round(step_ms, 3),
            "step_kernels": step_kernels,
            "refill_ms": round(refill_ms, 3),
            "refill_prompts": args.refill,
            "refill_kernels": refill_kernels,
            "refill_prompt_tokens": sum(map(len, spare)),
            "round_ms": round(round_ms, 2),
            "tokens_per_s_steps_only": round(B / step_ms * 1e3),
            "tokens_per_s_round": round(B * args.chunk / round_ms * 1e3),
            "step_top": step_top,
            "refill_top": refill_top,
            "graphed": graphed,
        }
        result["variants"][attention] = v
        print(json.dumps({k: x for k, x in v.items() if not k.endswith("_top")}), flush=True)
        print("  step top kernels:\n    " + "\n    ".join(step_top), flush=True)
        print("  refill top kernels:\n    " + "\n    ".join(refill_top), flush=True)
        for name, g in graphed.items():
            if not isinstance(g, dict):
                continue
            print(f"  graphed refill, {name}: " + json.dumps({k: x for k, x in g.items() if k != "top"}), flush=True)
            print("    " + "\n    ".join(g["top"]), flush=True)
        dec = runner = refill = None  # free the cache before the next variant
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "profile_batch.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
