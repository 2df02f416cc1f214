"""Benchmark the generate stage: eaglekit's continuous-batching decoder against Hugging Face `generate`.

One run, one target, greedy, the same batch and max new tokens for every backend, all through the
stage code (`eaglekit.data.regenerate`: the local backend, shards written):

    engine       the engine answers `--num-prompts` prompts: the throughput of a long run, where
                 continuous batching keeps every row busy (the rows drain only at the end)
    engine same  the engine answers the first `--hf-prompts` of them (default: one batch) ...
    hf           ... and so does HF `generate` at the same batch: like for like, side by side

Prompts: the first user turn of every prompt in the folder's files (multi-turn is the stage's job,
tested on CPU; one turn keeps the cache size fixed), in a hash order, at most `--max-prompt-tokens`
tokens. Each engine variant (`--attention`) is built once (torch.compile + CUDA-graph capture,
timed apart) and warmed up. If a variant fails (e.g. "flex" does not compile on this torch), the
error is recorded and `--on-error` is measured in its place, said so in the table.

GPU (from the repo root; the target staged as in ../shared/gpu/stage-target.sh, prompt files
carried under .device/prompts):
    . scripts/gpu/setup.sh && python scripts/gpu/bench_generate.py --target $EAGLEKIT_SMOLLM2_DIR \
        --prompts .device/prompts --out $OUT
CPU smoke run (tiny target, a few prompts):
    python scripts/gpu/bench_generate.py --smoke --target TINY_DIR --prompts FILE_OR_FOLDER --out /tmp/bench

Writes $OUT/bench_generate.json (figures, decoder statistics, environment, command) and the
conversations of each run under $OUT/runs/; prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch

from eaglekit.artifacts import sha256_json
from eaglekit.data.generators import EngineGenerator, HFGenerator, Sampling
from eaglekit.data.local_backend import LocalBackend
from eaglekit.data.readers import SourceSpec, read_source
from eaglekit.data.records import Prompt, order_key
from eaglekit.data.regenerate import GenerateConfig, generate_conversations
from eaglekit.errors import EaglekitError
from eaglekit.targets import load_target
from eaglekit.targets.chat import prompt_ids
from eaglekit.targets.load import resolve_device, text_config
from eaglekit.targets.source import DEFAULT_TARGET

REPO = Path(__file__).resolve().parents[2]
# ../shared/data/train here; on the GPU machine a copy carried under .device/prompts (git-ignored).
PROMPT_DIRS = (REPO.parent / "shared/data/train", REPO / "shared/data/train", REPO / ".device/prompts")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=os.environ.get("EAGLEKIT_SMOLLM2_DIR", DEFAULT_TARGET))
    p.add_argument(
        "--prompts",
        default=os.environ.get("EAGLEKIT_BENCH_PROMPTS"),
        help="prompt file or folder (default: ../shared/data/train, else .device/prompts)",
    )
    p.add_argument("--num-prompts", type=int, default=4096, help="prompts of the engine's long run")
    p.add_argument("--hf-prompts", type=int, help="prompts both backends answer (default: one batch)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="longer prompts are left out")
    p.add_argument(
        "--attention",
        default="flex",
        help="engine variants, comma-separated: ATTENTION[/REFILL] (kv.ATTENTION_KINDS; batch.REFILL_KINDS, "
        "default eager), e.g. flex,flex/graphs",
    )
    p.add_argument("--on-error", default="sdpa", help="variant measured instead of one that fails ('' = none)")
    p.add_argument("--chunk", type=int, default=16, help="decode steps between the engine's host checks")
    p.add_argument("--backends", default="engine,hf", help="comma-separated: engine, hf")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on GPU, fp32 on CPU")
    p.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    p.add_argument("--smoke", action="store_true", help="CPU, 12 prompts (4 for HF), batch 4, 16 new tokens")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.num_prompts, args.hf_prompts, args.batch_size, args.max_new_tokens = "cpu", 12, 4, 4, 16
    args.device = resolve_device(args.device)
    args.hf_prompts = min(args.hf_prompts or args.batch_size, args.num_prompts)
    return args


def choose_prompts(location: str | None, n: int, tokenizer, max_tokens: int) -> tuple[str, list[Prompt], list[int]]:
    """n one-turn prompts of at most max_tokens, a hash-ordered mix of the folder's sources (the same every run)."""
    if location is None:
        location = next((str(d) for d in PROMPT_DIRS if d.is_dir()), None)
        if location is None:
            raise EaglekitError(
                f"no prompts found in {', '.join(map(str, PROMPT_DIRS))}", hint="pass --prompts FILE_OR_FOLDER"
            )
    report = read_source(SourceSpec.parse(location))
    if report.malformed:
        raise EaglekitError(f"{location}: malformed records, e.g. {report.malformed[0]}", hint="check the prompts")
    chosen, lengths = [], []
    for p in sorted(report.prompts, key=lambda p: order_key(p, 0)):
        first = Prompt(id=f"b{len(chosen)}", source=p.source, turns=p.turns[:1], system=p.system)
        ids = prompt_ids(tokenizer, first.messages())
        if len(ids) <= max_tokens:
            chosen.append(first)
            lengths.append(len(ids))
        if len(chosen) == n:
            break
    if len(chosen) < n:
        raise EaglekitError(
            f"{location} holds {len(chosen)} prompts of at most {max_tokens} tokens, not {n}",
            hint="lower --num-prompts or raise --max-prompt-tokens",
        )
    return location, chosen, lengths


def environment(device: str) -> dict:
    import transformers

    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_count"] = torch.cuda.device_count()
    else:
        env["cpu_threads"] = torch.get_num_threads()
    return env


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def free_memory(device: str, compiled: bool = False) -> None:
    if compiled:
        torch._dynamo.reset()  # compiled steps hold their decoder (and its KV cache) alive
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def stage_run(generator, target, prompts_file: Path, out: Path, args) -> dict:
    """The generate stage over one prompt file; its figures."""
    backend = LocalBackend(
        target.tokenizer,
        generator,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        context_length=10**9,
    )
    manifest = generate_conversations(
        str(prompts_file),
        out,
        backend=backend,
        target_fp=target.fingerprint(),
        config=GenerateConfig(max_new_tokens=args.max_new_tokens),
        overwrite=True,
    )
    speed, counts = manifest["throughput_last_run"], manifest["counts"]
    return {
        "prompts": counts["conversations"],
        "answer_tokens": counts["answer_tokens"],
        "seconds": speed["seconds"],
        "prompts_per_s": speed["prompts_per_s"],
        "tokens_per_s": speed["tokens_per_s"],
        "finish_reason": counts["finish_reason"],
        "batch_size": args.batch_size,
    }


def kv_bytes_per_token(target) -> int:
    cfg = text_config(target.model.config)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * target.model.dtype.itemsize


def decoder_figures(result: dict, stats: dict, folder: Path, lengths: dict[str, int], target, device: str) -> dict:
    """Step time, rows busy, and the KV bytes a step reads (the bound on a long run)."""
    rows = read_rows(folder)
    answered = [(lengths[r["id"]], r["meta"]["num_tokens"]) for r in rows]
    tokens = sum(n for _, n in answered)
    # A row at answer token j reads P + j cached tokens: the mean context a busy row-step reads.
    context = sum(P * n + n * n / 2 for P, n in answered) / max(tokens, 1)
    kv_step = stats["rows"] * stats["occupancy"] * context * kv_bytes_per_token(target)
    step_s = result["seconds"] / max(stats["steps"], 1)
    out = {
        **stats,
        "step_ms": round(1000 * step_s, 3),
        "mean_context": round(context, 1),
        "kv_gb_per_step": round(kv_step / 1e9, 3),
        "mean_answer_tokens": round(tokens / max(len(rows), 1), 1),
    }
    if device.startswith("cuda"):
        out["kv_read_tb_s"] = round(kv_step / step_s / 1e12, 3)  # an upper bound: steps include refills
        out["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return out


def run_engine(
    variant: str,
    target,
    files: dict[str, Path],
    out: Path,
    args,
    lengths: dict[str, int],
    max_len: int,
    runs=("same", "all"),
) -> dict:
    """Build and warm one engine variant, then the like-for-like run and the long run."""
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    attention, _, refill = variant.partition("/")
    generator = EngineGenerator(
        target.model,
        target.stop_token_ids,
        Sampling(),
        batch_size=args.batch_size,
        attention=attention or None,
        chunk=args.chunk,
        max_len=max_len,
        refill=refill or "eager",
    )
    generator.prepare(max_len - args.max_new_tokens, args.max_new_tokens)  # compile + capture
    build = time.perf_counter() - start
    generator.generate([[target.stop_token_ids[0]] * 8] * min(args.batch_size, 64), 4)  # warm the refill
    sync(args.device)
    result = {
        "variant": variant,
        "build_s": round(build, 2),
        "build_and_warmup_s": round(time.perf_counter() - start, 2),
        "decoder_slots": generator.max_len,
        "runner": generator._decoder.runner.kind,
        "same_as_eager": same_as_eager(generator, target, files["same"], args),
    }
    print(
        json.dumps({"engine": variant, "build_s": result["build_s"], "same_as_eager": result["same_as_eager"]}),
        flush=True,
    )
    for name in runs:
        folder = out / "runs" / f"engine-{variant.replace('/', '+')}-{name}"
        run = stage_run(generator, target, files[name], folder, args)
        run["decoder"] = decoder_figures(run, generator._decoder.stats(), folder, lengths, target, args.device)
        result[name] = run
        print(json.dumps({"engine": variant, "run": name, **run}), flush=True)
    if generator.builds != 1:
        raise EaglekitError(
            f"the decoder was rebuilt during the runs ({generator.builds} builds)",
            hint="the timings include a compile: raise max_len",
        )
    del generator
    free_memory(args.device, compiled=True)
    return result


def same_as_eager(generator: EngineGenerator, target, prompts_file: Path, args, n: int = 16) -> dict:
    """Share of n greedy answers (new tokens each) the built decoder gives exactly as an eager,
    uncompiled batch decoder with SDPA does: a check of the compiled kernels, apart from HF's numerics."""
    from eaglekit.data.batch_decoder import BatchDecoder, batch_runner

    new = min(64, args.max_new_tokens)
    rows = [json.loads(line) for line in jsonl_lines(prompts_file)[:n]]
    ids = [prompt_ids(target.tokenizer, Prompt.from_json(r).messages()) for r in rows]
    fast = [c.token_ids for c in generator.generate(ids, new)]
    eager = BatchDecoder(
        batch_runner(
            target.model,
            max_len=max(map(len, ids)) + new,
            batch_size=len(ids),
            attention="sdpa" if generator._decoder.runner.kind == "fast" else None,
        ),
        sampling=Sampling(),
        graphs=False,
        compile=False,
    )
    slow = [c.tokens for c in eager.run(ids, new, target.stop_token_ids)]
    del eager
    free_memory(args.device)
    return {
        "answers": len(ids),
        "new_tokens": new,
        "identical": round(sum(a == b for a, b in zip(fast, slow)) / len(ids), 3),
    }


def run_hf(target, files: dict[str, Path], out: Path, args) -> dict:
    generator = HFGenerator(target.model, target.stop_token_ids, Sampling())
    start = time.perf_counter()
    generator.generate([[target.stop_token_ids[0]] * 8] * args.batch_size, 4)  # warm-up batch
    sync(args.device)
    warmup = time.perf_counter() - start
    run = stage_run(generator, target, files["same"], out / "runs" / "hf", args)
    run["build_and_warmup_s"] = round(warmup, 2)
    print(json.dumps({"hf": "generate", **run}), flush=True)
    free_memory(args.device)
    return run


def jsonl_lines(path: Path) -> list[str]:
    """The lines of a JSONL file, split at \\n only: str.splitlines() also splits at U+2028 and other
    separators that JSON strings hold unescaped (a 4096-prompt run failed on one)."""
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line]


def read_rows(folder: Path) -> list[dict]:
    from eaglekit.features.conversations import read_conversations  # the training stage's own reader

    return read_conversations(folder)[0]


def agreement(a: Path, b: Path) -> dict:
    """Share of answers identical in both folders, and identical over their first 100 characters."""
    x = {r["id"]: r["messages"][-1]["content"] for r in read_rows(a)}
    y = {r["id"]: r["messages"][-1]["content"] for r in read_rows(b)}
    n = max(len(x), 1)
    return {
        "identical": round(sum(x[k] == y.get(k) for k in x) / n, 3),
        "first_100_chars": round(sum(x[k][:100] == (y.get(k) or "")[:100] for k in x) / n, 3),
    }


def engine_variants(target, files, out, args, lengths, max_len) -> tuple[dict, dict]:
    """Each --attention variant; one that fails is recorded and --on-error measured instead (on the
    like-for-like prompts only: a dense kernel over every row's slots is slow on a long run)."""
    results, errors = {}, {}
    todo = [(v, ("same", "all")) for v in args.attention.split(",") if v]
    while todo:
        variant, runs = todo.pop(0)
        try:
            results[variant] = run_engine(variant, target, files, out, args, lengths, max_len, runs)
        except Exception as err:  # a benchmark records a failed variant and goes on
            errors[variant] = f"{type(err).__name__}: {err}"[:2000]
            print(f"engine variant {variant!r} failed:\n{traceback.format_exc()[-4000:]}", file=sys.stderr, flush=True)
        if variant in errors:  # out of the except block: its traceback no longer holds the decoder
            free_memory(args.device, compiled=True)
            if args.on_error and args.on_error not in [*results, *errors, *(v for v, _ in todo)]:
                todo.append((args.on_error, ("same",)))
    return results, errors


def main(argv=None) -> int:
    began = time.perf_counter()
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    location, prompts, lengths = choose_prompts(
        args.prompts, args.num_prompts, target.tokenizer, args.max_prompt_tokens
    )
    files = {"all": out / "bench_prompts.jsonl", "same": out / "bench_prompts_same.jsonl"}
    files["all"].write_text("".join(json.dumps(p.to_json()) + "\n" for p in prompts))
    files["same"].write_text("".join(json.dumps(p.to_json()) + "\n" for p in prompts[: args.hf_prompts]))
    by_id = {p.id: n for p, n in zip(prompts, lengths)}
    max_len = max(lengths) + args.max_new_tokens
    backends = [b for b in args.backends.split(",") if b]
    engines, errors = engine_variants(target, files, out, args, by_id, max_len) if "engine" in backends else ({}, {})
    hf = run_hf(target, files, out, args) if "hf" in backends else None
    report = {
        "bench": "generate",
        "smoke": args.smoke,
        "environment": environment(args.device),
        "target": target.fingerprint(),
        "dtype": str(target.model.dtype),
        "device": args.device,
        "prompts": {
            "from": location,
            "count": len(prompts),
            "same_as_hf": args.hf_prompts,
            "longest_prompt_tokens": max(lengths),
            "mean_prompt_tokens": round(sum(lengths) / len(lengths), 1),
            "hash": sha256_json([p.to_json() for p in prompts]),
            "turns": "first user turn only",
        },
        "config": {
            "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens,
            "sampling": "greedy",
            "chunk": args.chunk,
            "attention": args.attention,
        },
        "engine": engines,
        "engine_errors": errors,
        "hf": hf,
    }
    report["wall_s"] = round(time.perf_counter() - began, 1)
    if hf:
        for variant, r in engines.items():
            r["speedup_same_over_hf"] = round(r["same"]["tokens_per_s"] / hf["tokens_per_s"], 2)
            r["agreement_with_hf"] = agreement(
                out / "runs" / f"engine-{variant.replace('/', '+')}-same", out / "runs" / "hf"
            )
    (out / "bench_generate.json").write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0 if engines or "engine" not in backends else 1


def print_table(report: dict) -> None:
    env, cfg = report["environment"], report["config"]
    print(
        f"\ngenerate benchmark: {report['target']['name']} ({report['dtype']}) on {env.get('gpu', 'cpu')}, "
        f"batch {cfg['batch_size']}, max {cfg['max_new_tokens']} new tokens, greedy, first turns of "
        f"{report['prompts']['count']} prompts (mean {report['prompts']['mean_prompt_tokens']} tokens), {env['date']}, "
        f"{report['wall_s']:.0f} s in all"
    )
    for variant, error in report["engine_errors"].items():
        print(f"engine variant {variant!r} FAILED: {error.splitlines()[0][:300]}")
    print(
        f"{'run':<22} {'prompts':>7} {'tokens':>9} {'tok/answer':>10} {'at max':>6} {'seconds':>8} {'tokens/s':>9} "
        f"{'step ms':>7} {'busy':>5} {'KV GB/step':>10} {'build s':>7}"
    )

    def row(name, r, build, d=None):
        at_max = r["finish_reason"].get("length", 0) / max(r["prompts"], 1)
        extra = (
            f"{d['step_ms']:>7.2f} {100 * d['occupancy']:>4.0f}% {d['kv_gb_per_step']:>10.2f}"
            if d
            else f"{'':>7} {'':>5} {'':>10}"
        )
        print(
            f"{name:<22} {r['prompts']:>7} {r['answer_tokens']:>9} {r['answer_tokens'] / max(r['prompts'], 1):>10.0f} "
            f"{100 * at_max:>5.0f}% {r['seconds']:>8.1f} {r['tokens_per_s']:>9.0f} {extra} {build:>7.1f}"
        )

    for variant, r in report["engine"].items():
        if "all" in r:
            row(f"engine {variant}", r["all"], r["build_and_warmup_s"], r["all"]["decoder"])
        row(f"engine {variant} (same)", r["same"], 0.0 if "all" in r else r["build_and_warmup_s"], r["same"]["decoder"])
    if report["hf"]:
        row("hf generate (same)", report["hf"], report["hf"]["build_and_warmup_s"])
    for variant, r in report["engine"].items():
        if "speedup_same_over_hf" in r:
            a = r["agreement_with_hf"]
            print(
                f"engine {variant} / hf tokens/s on the same {report['prompts']['same_as_hf']} prompts: "
                f"{r['speedup_same_over_hf']:.2f}x; identical answers {100 * a['identical']:.1f} %, "
                f"same first 100 characters {100 * a['first_100_chars']:.1f} %"
            )
    for variant, r in report["engine"].items():
        run = r.get("all", r["same"])
        print(
            f"engine {variant}: {run['tokens_per_s']:,.0f} answer tokens/s over {run['prompts']} prompts "
            f"({run['decoder']['rows']} rows x {run['decoder']['slots']} slots); compiled = eager on "
            f"{100 * r['same_as_eager']['identical']:.0f} % of {r['same_as_eager']['answers']} answers "
            f"({r['same_as_eager']['new_tokens']} tokens)"
        )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EaglekitError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
