"""GPU evidence for eaglekit's engine (issue 5): plain decoding, speculation overhead, batching.

Parts (run any subset with --parts; each writes its results into $OUT/bench_engine.json as soon as
it is done, so a run cut short still returns what it measured):

    a  SmolLM2 plain decoding at batch 1: engine tok/s vs HF generate vs the memory floor
       (weight bytes / bandwidth measured by a device-to-device copy in the same run)
    b  a Llama-shaped 8B model with random weights (bf16): engine tok/s and share of the floor
    c  SmolLM2 with the oracle draft (chain and tree): speedup vs the ideal (tau at equal cost),
       and a random draft (real draft cost, no acceptance): cost of one cycle
    o  the same oracle measurement on the Llama-shaped 8B model of part b
    s  (with c or o) where one speculative cycle's time goes (eaglekit.engine.profile): the draft's
       pieces (compaction, catch-up, proposal) captured and replayed alone, verify as the rest of the
       fused cycle graph, and the host's share, with kernel counts; for every engine of parts c / o
    d  a trained draft (--draft DIR): tau and speedup on --prompts (as `eaglekit bench`)
    e  SmolLM2 batched generation (`generate_batch`) vs HF generate at the same batch size
    p  profile of SmolLM2's captured plain decode step: kernels per step, top kernels, busy share
       (parts a, b and p run once per --kernels variant: the same math in different kernels)

    python scripts/gpu/bench_engine.py --target /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --parts a,b
    python scripts/gpu/bench_engine.py --smoke      # CPU, tiny random models, a few tokens

It prints a compact table last and writes $OUT/bench_engine.json and $OUT/bench_engine.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from eaglekit.data.batch_decoder import generate_batch  # noqa: E402
from eaglekit.engine import DraftRunner, Engine, OracleDrafter, SpecConfig  # noqa: E402
from eaglekit.errors import EaglekitError  # noqa: E402
from eaglekit.runtime import Sampling, make_target_runner  # noqa: E402
from eaglekit.runtime.kv import ATTENTION_KINDS  # noqa: E402
from eaglekit.targets.load import resolve_device  # noqa: E402
from eaglekit.targets.source import DEFAULT_TARGET  # noqa: E402

log = logging.getLogger("bench_engine")
CHAIN = SpecConfig(mode="chain", k=5)
TREE = SpecConfig(mode="tree", depth=6, top_k=8, total_tokens=32)  # the goal's tree of 32 nodes
SMOKE_SPECS = (SpecConfig(mode="chain", k=3), SpecConfig(mode="tree", depth=3, top_k=3, total_tokens=10))
PROMPT = "Write a long, detailed story about a dragon who learns to paint. Describe every scene."


# ---- measuring --------------------------------------------------------------------------------


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(device, gib: float = 1.0, repeats: int = 20) -> float | None:
    """Bytes/s of a device-to-device copy (read + write counted), or None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    src = torch.empty(int(gib * 2**30) // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync(device)
    seconds = (time.perf_counter() - start) / repeats
    return 2 * src.numel() * src.element_size() / seconds


def streamed_bytes(model) -> int:
    """Weight bytes read per decoded token: every parameter once (an untied input embedding is
    only indexed, so it is left out; a tied one is read by the LM head)."""
    seen, total = set(), 0
    embed = model.get_input_embeddings().weight
    tied = embed.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    for p in model.parameters():
        if p.data_ptr() in seen or (p is embed and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def median_run(fn, repeats: int):
    """Run fn() `repeats` times; return the result of the median-time run."""
    runs = sorted((fn() for _ in range(repeats)), key=lambda r: r["seconds"])
    return runs[len(runs) // 2]


def engine_plain(engine: Engine, ids: list[int], new: int, repeats: int) -> dict:
    engine.generate(ids, new, speculative=False)  # compile + capture

    def once():
        gen = engine.generate(ids, new, speculative=False)
        return {"tokens": len(gen.tokens), "seconds": gen.seconds, "ids": gen.tokens}

    return with_rate(median_run(once, repeats))


def engine_spec(engine: Engine, ids: list[int], new: int, repeats: int) -> dict:
    engine.generate(ids, new)

    def once():
        gen = engine.generate(ids, new)
        return {
            "tokens": len(gen.tokens),
            "seconds": gen.seconds,
            "tau": gen.tau,
            "cycles": len(gen.accept_lengths),
            "ids": gen.tokens,
        }

    return with_rate(median_run(once, repeats))


@torch.no_grad()
def hf_generate(model, ids: list[list[int]], new: int, repeats: int) -> dict:
    """HF generate, greedy, no stop token (exactly `new` tokens), dynamic cache as a user calls it."""
    device = next(model.parameters()).device
    x = torch.tensor(ids, device=device)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None

    def once():
        sync(device)
        start = time.perf_counter()
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            generation_config=config,
            max_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
        )
        sync(device)
        return {
            "tokens": (out.shape[1] - x.shape[1]) * x.shape[0],
            "seconds": time.perf_counter() - start,
            "ids": out[0, x.shape[1] :].tolist(),
        }

    once()
    return with_rate(median_run(once, repeats))


def with_rate(r: dict) -> dict:
    r["tok_s"] = r["tokens"] / r["seconds"]
    r["ms_per_token"] = 1000 * r["seconds"] / r["tokens"]
    return r


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def strip(r: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "ids"}


# ---- models -----------------------------------------------------------------------------------


def tiny_llama(device, *, hidden=64, layers=8, vocab=512, heads=4, kv=2, inter=128, seed=0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    return model.requires_grad_(False)


def llama_8b(device):
    """Llama-3-8B shapes, random weights, bf16 (no download)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval().requires_grad_(False)


def load_smollm2(args):
    """(model, prompt ids, stop ids): SmolLM2 (or --target), or a tiny random Llama with --smoke."""
    if args.smoke and not args.target:
        model = tiny_llama(args.device)
        return model, [(7 * i + 3) % 500 for i in range(24)], []
    from eaglekit.targets.chat import prompt_ids
    from eaglekit.targets.load import load_target

    target = load_target(args.target or DEFAULT_TARGET, device=args.device, dtype=args.dtype)
    ids = prompt_ids(target.tokenizer, [{"role": "user", "content": PROMPT}])
    return target.model, ids, target.stop_token_ids


# ---- parts ------------------------------------------------------------------------------------

PLAIN_ENGINES: dict = {}


def tree_shape(text: str) -> SpecConfig:
    """ "4/4/16" -> the tree of depth 4, top-k 4 and 16 nodes verified a cycle (root included)."""
    try:
        return SpecConfig.parse(f"tree:{text}")
    except EaglekitError:
        raise SystemExit(f"--trees: {text!r} is not DEPTH/TOP_K/TOTAL_TOKENS, e.g. 4/4/16") from None


def kernel_options(variant: str) -> dict:
    """ "reduce+matvec@8" -> {"attention": "reduce", "matvec": True, "small_rows": 8} (fast runner
    options; without @N the runner's default small_rows). "reduce+matvec@1/32": the reduce
    attention up to 32 rows (`attention_rows`), the matvec linears up to 1."""
    spec, _, rows = variant.partition("@")
    rows, _, attention_rows = rows.partition("/")
    attention, _, extra = spec.partition("+")
    if (
        extra not in ("", "matvec")
        or attention not in ATTENTION_KINDS
        or not all(n.isdigit() for n in (rows, attention_rows) if n)
        or (attention_rows and not rows)
    ):
        raise SystemExit(
            f"--kernels: {variant!r} is not ATTENTION[+matvec][@ROWS[/ATTENTION_ROWS]] with ATTENTION in "
            f"{tuple(ATTENTION_KINDS)}"
        )
    return {
        "attention": attention,
        "matvec": extra == "matvec",
        **({"small_rows": int(rows)} if rows else {}),
        **({"attention_rows": int(attention_rows)} if attention_rows else {}),
    }


def plain_engine(args, smol, ids, variant: str) -> Engine:
    """The plain-decoding engine of parts a and p, built (compiled, captured) once per kernel variant."""
    if variant not in PLAIN_ENGINES:
        runner = make_target_runner(smol, max_len=round_up(len(ids) + args.new_tokens + 128), **kernel_options(variant))
        PLAIN_ENGINES[variant] = Engine(runner, compile=args.compile, compile_mode=args.compile_mode)
    return PLAIN_ENGINES[variant]


def part_a(args, smol, ids, bw) -> dict:
    """Plain decoding with each --kernels variant, side by side with HF generate in the same run."""
    new = args.new_tokens
    engines = {kind: engine_plain(plain_engine(args, smol, ids, kind), ids, new, args.repeats) for kind in args.kernels}
    best = min(engines, key=lambda kind: engines[kind]["ms_per_token"])
    args.best_kernels = best
    eng = engines[best]
    hf = hf_generate(smol, [ids], new, args.repeats)
    weights = streamed_bytes(smol)
    floor_ms = 1000 * weights / bw if bw else None
    return {
        "runner": PLAIN_ENGINES[best].target.kind,
        "kernels": best,
        "new_tokens": new,
        "engine": strip(eng),
        "engine_by_kernels": {
            kind: {**strip(r), "speedup_vs_hf": r["tok_s"] / hf["tok_s"]} for kind, r in engines.items()
        },
        "hf_generate": strip(hf),
        "speedup_vs_hf": eng["tok_s"] / hf["tok_s"],
        "weight_bytes": weights,
        "floor_ms_per_token": floor_ms,
        "floor_share": floor_ms / eng["ms_per_token"] if floor_ms else None,
        "greedy_prefix_match_vs_hf": same_prefix(eng["ids"], hf["ids"]),
    }


def part_b(args, bw) -> dict:
    """A Llama-shaped 8B model with random weights: the share of the bandwidth floor reached, for
    each --kernels variant (the runners share the model's weights; each has its own KV cache)."""
    model = (
        tiny_llama(args.device, hidden=128, layers=8, vocab=1024, heads=8, kv=2, inter=256)
        if args.smoke
        else llama_8b(args.device)
    )
    ids = [(37 * i + 11) % 1000 for i in range(32)]
    new = args.new_tokens
    weights = streamed_bytes(model)
    floor_ms = 1000 * weights / bw if bw else None
    engines = {}
    for variant in args.kernels:
        runner = make_target_runner(model, max_len=round_up(len(ids) + new + 128), **kernel_options(variant))
        engine = Engine(runner, compile=args.compile, compile_mode=args.compile_mode)
        eng = strip(engine_plain(engine, ids, new, args.repeats))
        engines[variant] = {**eng, "floor_share": floor_ms / eng["ms_per_token"] if floor_ms else None}
        kind = runner.kind
        del engine, runner
    best = min(engines, key=lambda variant: engines[variant]["ms_per_token"])
    hf = hf_generate(model, [ids], min(new, 64), 1)
    out = {
        "runner": kind,
        "kernels": best,
        "parameters": sum(p.numel() for p in model.parameters()),
        "engine": engines[best],
        "engine_by_kernels": engines,
        "hf_generate_64": strip(hf),
        "weight_bytes": weights,
        "floor_ms_per_token": floor_ms,
        "floor_share": engines[best]["floor_share"],
    }
    del model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def part_c(args, smol, ids) -> dict:
    """Oracle (perfect greedy draft) and random draft, chain and tree, against plain decoding."""
    from eaglekit.formats.load import random_draft_for

    return oracle_and_random(args, smol, ids, random_draft_for(smol, args.device), args.best_kernels)


def part_o(args) -> dict:
    """Part c's oracle on the 8B shape (random weights: the oracle replays its own greedy output)."""
    model = (
        tiny_llama(args.device, hidden=128, layers=8, vocab=1024, heads=8, kv=2, inter=256)
        if args.smoke
        else llama_8b(args.device)
    )
    ids = [(37 * i + 11) % 1000 for i in range(32)]
    try:
        return oracle_and_random(args, model, ids, None, args.kernels_8b)
    finally:
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


def oracle_and_random(args, model, ids, draft, variant: str) -> dict:
    """Plain decoding, then each speculation shape with the oracle (and the random `draft` unless
    --oracle-only or None), in one runner; part s profiles each engine's cycle after its timing."""
    from eaglekit.bench.run import settle_oracle
    from eaglekit.targets.info import default_aux_layer_ids

    new = args.new_tokens
    max_len = round_up(len(ids) + new + 256)
    aux = default_aux_layer_ids(model.config.num_hidden_layers)
    runner = make_target_runner(model, max_len=max_len, aux_layer_ids=aux, **kernel_options(variant))
    plain_engine_ = Engine(runner, compile=args.compile, compile_mode=args.compile_mode)
    plain = engine_plain(plain_engine_, ids, new, args.repeats)
    step_ms = decode_step_ms(plain_engine_, ids)
    reference = ids + plain["ids"]
    out = {"kernels": variant, "plain": strip(plain), "plain_step_ms": step_ms}
    plain_ms = 1000 * plain["seconds"] / plain["tokens"]

    def record(name: str, engine: Engine, oracle_rounds: int | None = None) -> None:
        """Time `engine` against plain decoding, keep the entry (and part s's profile) as it is made;
        an oracle's entry adds its ideal (tau) and the efficiency reached."""
        eng = engine_spec(engine, ids, new, args.repeats)
        cycle_ms = 1000 * eng["seconds"] / max(eng["cycles"], 1)
        speedup = eng["tok_s"] / plain["tok_s"]
        out[name] = {
            **strip(eng),
            "speedup": speedup,
            "match": eng["ids"] == plain["ids"],
            "cycle_ms": cycle_ms,
            "cycle_in_plain_steps": cycle_ms / plain_ms,
        }
        if oracle_rounds is not None:
            out[name].update(ideal=eng["tau"], efficiency=speedup / eng["tau"], oracle_rounds=oracle_rounds)
        save_partial(args, out)
        if "s" in args.parts_list:
            out[name]["profile"] = profile_cycle(args, engine, ids)
            save_partial(args, out)

    for spec in SMOKE_SPECS if args.smoke else (CHAIN, *args.trees):
        oracle = OracleDrafter(reference, spec=spec, vocab_size=runner.vocab_size, max_len=max_len, device=args.device)
        engine = Engine(runner, drafter=oracle, spec=spec, compile=args.compile, compile_mode=args.compile_mode)
        settled, rounds = settle_oracle(engine, oracle, ids, plain["ids"], new)  # bf16: see settle_oracle
        oracle.set_reference(ids + settled)
        record(f"oracle {spec.label()}", engine, oracle_rounds=rounds)
        if args.oracle_only or draft is None:
            continue
        draft_kernels = {k: v for k, v in kernel_options(variant).items() if k in ("small_rows", "attention_rows")}
        drafter = DraftRunner(draft, spec=spec, sampling=Sampling(), max_len=max_len, **draft_kernels)
        record(
            f"random {spec.label()}",
            Engine(runner, drafter=drafter, spec=spec, compile=args.compile, compile_mode=args.compile_mode),
        )
    return out


def save_partial(args, out: dict) -> None:
    """What a part measured so far, so that a run cut short at its time limit still returns it."""
    Path(args.out, "partial.json").write_text(json.dumps(out, indent=2, default=str))


def decode_step_ms(engine: Engine, ids) -> float:
    """One plain decode step replayed back to back (the graph alone, no host check)."""
    from eaglekit.engine.profile import replay_ms

    engine.generate(ids, 16, speculative=False)  # leaves a valid state
    return replay_ms(engine.decode, engine.device)


def profile_cycle(args, engine: Engine, ids) -> dict:
    """Where one speculative cycle's time goes (`eaglekit.engine.profile.cycle_profile`)."""
    from eaglekit.engine.profile import cycle_profile

    return cycle_profile(engine, ids, args.new_tokens)


def part_d(args) -> dict:
    """A trained draft on --prompts, through `eaglekit bench` (HF generate is part a's number)."""
    from eaglekit.bench.benchmark import benchmark
    from eaglekit.bench.options import BenchOptions
    from eaglekit.engine.options import shape_options

    results = {}
    for spec in SMOKE_SPECS if args.smoke else (SpecConfig(mode="chain", k=args.k), TREE):
        cfg = BenchOptions(
            target=args.target or DEFAULT_TARGET,
            draft=args.draft,
            prompts=args.prompts,
            **shape_options(spec),
            max_new_tokens=args.new_tokens,
            limit=args.limit,
            hf=False,
            device=args.device,
            dtype=args.dtype,
            no_compile=args.compile is False,
        )
        res = benchmark(cfg, command=" ".join(sys.argv))
        results[spec.label()] = {
            k: res["summary"][k]
            for k in (
                "tau",
                "speedup",
                "baseline_tok_s",
                "spec_tok_s",
                "per_position_acceptance",
                "greedy_match",
                "turns",
            )
        }
    return results


def part_e(args, smol, ids) -> dict:
    """Batched plain generation: the decoder `generate_batch` uses (built once: compile + capture
    are not timed), against HF generate at the same batch size."""
    from eaglekit.data.batch_decoder import BatchDecoder

    batch, new = args.batch, args.new_tokens
    vocab = smol.get_input_embeddings().weight.shape[0]
    rows = [[(t + 13 * r) % (vocab - 20) + 10 for t in ids[:32]] for r in range(batch)]  # same length: no padding
    runner = make_target_runner(smol, max_len=round_up(len(rows[0]) + new + 16), batch_size=batch)
    cuda = torch.device(args.device).type == "cuda"
    decoder = BatchDecoder(
        runner,
        sampling=Sampling(),
        graphs=cuda,
        compile=cuda if args.compile is None else False,
        compile_mode=args.compile_mode,
    )
    decoder.run(rows, new, set())

    def once():
        sync(args.device)
        start = time.perf_counter()
        done = decoder.run(rows, new, set())
        sync(args.device)
        return {
            "tokens": sum(len(c.tokens) for c in done),
            "seconds": time.perf_counter() - start,
            "ids": done[0].tokens,
        }

    eng = with_rate(median_run(once, args.repeats))
    hf = hf_generate(smol, rows, new, 1)
    check = generate_batch(
        smol, rows[:2], max_new_tokens=8, stop_token_ids=[], batch_size=2, compile=False, graphs=False
    )  # the public entry point runs
    return {
        "batch": batch,
        "new_tokens": new,
        "runner": runner.kind,
        "engine": strip(eng),
        "hf_generate": strip(hf),
        "speedup_vs_hf": eng["tok_s"] / hf["tok_s"],
        "row0_prefix_match_vs_hf": same_prefix(eng["ids"], hf["ids"]),
        "generate_batch_row0_matches": check[0].tokens == eng["ids"][:8],
    }


def part_p(args, smol, ids) -> dict:
    """Where a plain decode step's time goes, for each --kernels variant."""
    return {kind: profile_decode(args, plain_engine(args, smol, ids, kind), ids) for kind in args.kernels}


def profile_decode(args, engine: Engine, ids, steps: int = 32) -> dict:
    """The kernels of `steps` replays of the captured decode step (CUDA graphs are traced kernel by
    kernel; on a CPU its ops): their count per step, the top ones by time, and the share of the
    step's wall time they fill (the rest is launch gaps)."""
    from eaglekit.engine.profile import kernel_profile

    engine.generate(ids, 16, speculative=False)  # compile + capture; leaves a state
    device = torch.device(args.device)
    pr = kernel_profile(engine.decode, device, calls=steps, top=25, cpu_ops=True)
    return {
        "steps": steps,
        "wall_us_per_step": 1000 * pr["wall_ms"],
        "kernel_us_per_step": 1000 * pr["busy_ms"],
        "busy_share": pr["busy_ms"] / pr["wall_ms"] if device.type == "cuda" else None,
        "kernels_per_step": pr["kernels"],
        "top": [{"name": k["name"], "per_step": k["per_call"], "us_per_step": k["us_per_call"]} for k in pr["top"]],
    }


def round_up(n: int, to: int = 128) -> int:
    return -(-n // to) * to


# ---- report -----------------------------------------------------------------------------------


def table(results: dict) -> str:
    lines = ["| measurement | tok/s | ms/token | vs reference |", "| --- | ---: | ---: | --- |"]

    def row(name, r, ref=""):
        lines.append(f"| {name} | {r['tok_s']:.1f} | {r['ms_per_token']:.3f} | {ref} |")

    if "a" in results:
        a = results["a"]
        row("a SmolLM2 HF generate", a["hf_generate"])
        floor = (
            f", floor {a['floor_ms_per_token']:.3f} ms ({100 * a['floor_share']:.0f}% of it)"
            if a["floor_share"]
            else ""
        )
        for kind, r in a["engine_by_kernels"].items():
            row(
                f"a SmolLM2 engine ({a['runner']}, {kind})",
                r,
                f"{r['speedup_vs_hf']:.1f}x HF{floor if kind == a['kernels'] else ''}",
            )
    if "b" in results:
        b = results["b"]
        floor = (
            f"floor {b['floor_ms_per_token']:.2f} ms = {100 * b['floor_share']:.0f}% reached"
            if b["floor_share"]
            else ""
        )
        row(f"b {b['parameters'] / 1e9:.2f}B random, HF generate", b["hf_generate_64"])
        for variant, r in b["engine_by_kernels"].items():
            share = f"{100 * r['floor_share']:.0f}% of the floor" if r["floor_share"] else ""
            row(
                f"b {b['parameters'] / 1e9:.2f}B random, engine ({variant})",
                r,
                f"{share}{' (' + floor + ')' if variant == b['kernels'] and floor else ''}",
            )
    for part in ("c", "o"):
        if part not in results:
            continue
        c = results[part]
        row(f"{part} plain (same runner, {c['kernels']}; step graph {c['plain_step_ms']:.3f} ms)", c["plain"])
        for name, r in c.items():
            if isinstance(r, dict) and "cycle_ms" in r:
                extra = f", ideal {r['ideal']:.2f}x, efficiency {100 * r['efficiency']:.0f}%" if "ideal" in r else ""
                row(
                    f"{part} {name}",
                    r,
                    f"{r['speedup']:.2f}x plain, tau {r['tau']:.2f}{extra}, cycle {r['cycle_ms']:.2f} ms "
                    f"= {r['cycle_in_plain_steps']:.2f} plain steps",
                )
                pr = r.get("profile")
                if pr:
                    pieces = ", ".join(
                        f"{k} {v['ms']:.3f} ms ({v['kernels'] or 0:.0f} kernels)" for k, v in pr["pieces"].items()
                    )
                    busy = f", kernels busy {pr['cycle_busy_ms']:.3f} ms" if pr.get("cycle_busy_ms") else ""
                    lines.append(
                        f"| {part} {name}: where the cycle goes | – | {pr['cycle_graph_ms']:.3f} | graph "
                        f"({pr['cycle_kernels'] or 0:.0f} kernels{busy}), host {pr['host_ms']:.3f} ms; {pieces} |"
                    )
                    for k in (pr.get("cycle_top_kernels") or [])[:5]:
                        lines.append(
                            f"| {part} {name}: top kernel | – | {k['us_per_call'] / 1000:.3f} | "
                            f"{k['per_call']:.0f} per cycle: `{k['name'][:70]}` |"
                        )
    if "d" in results:
        for name, r in results["d"].items():
            lines.append(
                f"| d trained draft {name} | {r['spec_tok_s']:.1f} | – | {r['speedup']:.2f}x plain, "
                f"tau {r['tau']:.2f}, greedy match {r['greedy_match']} |"
            )
    for kind, pr in results.get("p", {}).items():
        busy = f", kernels busy {100 * pr['busy_share']:.0f}% of it" if pr["busy_share"] else ""
        lines.append(
            f"| p plain decode step profiled ({kind}) | – | {pr['wall_us_per_step'] / 1000:.3f} | "
            f"{pr['kernels_per_step']:.0f} kernels per step{busy}; top: {pr['top'][0]['name'][:40] if pr['top'] else '-'} |"
        )
    if "e" in results:
        e = results["e"]
        row(f"e batch {e['batch']} HF generate", e["hf_generate"])
        row(f"e batch {e['batch']} generate_batch", e["engine"], f"{e['speedup_vs_hf']:.1f}x HF")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny random models, a few tokens")
    p.add_argument("--target", help="SmolLM2 as a .gguf file or HF folder (default: smollm2)")
    p.add_argument("--draft", help="a trained draft checkpoint folder (part d)")
    p.add_argument("--prompts", help="prompts for part d (default: the built-in set)")
    p.add_argument("--limit", type=int, default=20, help="part d: first N prompts")
    p.add_argument("--k", type=int, default=5, help="part d: chain length")
    p.add_argument("--parts", default="a,b,c,d,e")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--compile-mode", default="default", help="torch.compile mode of the steps, or `none` (CUDA graphs only)"
    )
    p.add_argument(
        "--kernels",
        default="reduce+matvec,sdpa",
        help="parts a, b and p: fast-runner kernel variants measured side by side, "
        "ATTENTION[+matvec][@ROWS[/ATTENTION_ROWS]] "
        "(comma list; part c uses the fastest of part a, else the first)",
    )
    p.add_argument("--oracle-only", action="store_true", help="part c: skip the random-draft runs")
    p.add_argument(
        "--trees",
        default="6/8/32",
        help="parts c and o: the tree shapes beside chain 5, DEPTH/TOP_K/TOTAL_TOKENS (comma list; "
        "6/8/32 is the goal's tree, 4/4/16 the recipe's bench shape)",
    )
    p.add_argument("--kernels-8b", default="sdpa", help="part o: the 8B shape's kernel variant")
    p.add_argument(
        "--coordinate-descent",
        action="store_true",
        help="Inductor coordinate-descent tuning (gpt-fast's setting; longer compiles)",
    )
    p.add_argument("--out", default=os.environ.get("OUT", "runs/bench_engine"))
    args = p.parse_args(argv)
    if args.coordinate_descent:
        from torch._inductor import config as inductor_config

        inductor_config.coordinate_descent_tuning = True
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.device = "cpu" if args.smoke and not args.device else resolve_device(args.device or "auto")
    args.compile = None if args.compile_mode != "none" else False
    args.kernels = [kind.strip() for kind in args.kernels.split(",") if kind.strip()]
    args.trees = [tree_shape(t) for t in args.trees.split(",") if t.strip()]
    for variant in args.kernels + [args.kernels_8b]:
        kernel_options(variant)  # refuse a bad variant before any work
    args.best_kernels = args.kernels[0]  # part a replaces it with the fastest
    if args.smoke:
        args.new_tokens, args.repeats, args.batch = min(args.new_tokens, 12), 1, min(args.batch, 3)
    parts = args.parts_list = [x.strip() for x in args.parts.split(",") if x.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
        "compile_mode": args.compile_mode,
        "errors": {},
    }
    bw = bandwidth(args.device)
    results["bandwidth_GBps"] = bw / 1e9 if bw else None
    smol = ids = None
    if {"a", "c", "e", "p"} & set(parts):
        smol, ids, _ = load_smollm2(args)
    for part in parts:
        start = time.time()
        try:
            if part == "a":
                results["a"] = part_a(args, smol, ids, bw)
            elif part == "b":
                results["b"] = part_b(args, bw)
            elif part == "c":
                results["c"] = part_c(args, smol, ids)
            elif part == "o":
                results["o"] = part_o(args)
            elif part == "s":
                if not {"c", "o"} & set(parts):
                    log.info("part s profiles the engines of parts c and o: add c or o")
            elif part == "d":
                if not args.draft:
                    log.info("part d skipped: no --draft")
                    continue
                results["d"] = part_d(args)
            elif part == "e":
                results["e"] = part_e(args, smol, ids)
            elif part == "p":
                results["p"] = part_p(args, smol, ids)
        except Exception as err:  # keep the other parts' numbers; the error is reported
            log.exception("part %s failed", part)
            results["errors"][part] = f"{type(err).__name__}: {err}"
        results.setdefault("seconds", {})[part] = round(time.time() - start, 1)
        (out / "bench_engine.json").write_text(json.dumps(results, indent=2, default=str))
    text = table(results)
    (out / "bench_engine.md").write_text(
        f"# eaglekit engine, {results['device']}, {results['date']}\n\n`{results['command']}`\n\n{text}\n"
    )
    print(
        f"\nbandwidth {results['bandwidth_GBps'] or 0:.0f} GB/s, {results['device']}, errors: {results['errors'] or 'none'}"
    )
    print(text)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
