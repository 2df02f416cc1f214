"""Draft training on GPU: throughput and memory (bench), DDP speedup (ddp), and the real draft (full).

Modes (comma-separated, run in this order):
  bench  one GPU, SmolLM2, ttt_steps=7: capture features once, then the same short run offline and
         online: tokens/s, peak memory, and validation metrics of both (top-k teacher vs exact one).
  ddp    the same offline run on 1 GPU and with torchrun on 2 GPUs (same batch per rank): speedup.
  full   the real draft from a conversations folder within --time-budget-s: capture, train, export
         the best checkpoint in bf16 under OUT/draft/ (split into <=15 MiB parts if needed).
Results: OUT/train_draft.json (one key per mode). --smoke runs every mode on the CPU with a tiny
random target in seconds (what the test suite runs).

GPU (one H200; ddp needs two):
  python scripts/gpu/train_draft.py --mode bench --target /root/stage/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
  python scripts/gpu/train_draft.py --mode full --target T --conversations CONV --time-budget-s 600 --out $OUT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))


def log(msg: str) -> None:
    print(f"[train_draft {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def smoke_target(work: Path) -> str:
    """A tiny random target (the test suite's) saved as an HF folder, with a sharp next-token distribution."""
    sys.path.insert(0, str(REPO / "tests"))
    from eaglekit.targets.load import load_target
    from tiny import save_tiny_target

    folder = work / "tiny-target"
    if not (folder / "config.json").is_file():
        save_tiny_target(folder, "llama")
        target = load_target(str(folder))
        with torch.no_grad():
            target.model.get_output_embeddings().weight.mul_(4.0)
        target.model.save_pretrained(folder)
    return str(folder)


def make_conversations(target: str, out: Path, num: int, max_new_tokens: int, batch: int) -> Path:
    """Synthesized prompts, answered greedily by the target (scripts/make_conversations.py)."""
    if (out / "manifest.json").is_file():
        return out
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_conversations", REPO / "scripts" / "make_conversations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(target, out, num=num, max_new_tokens=max_new_tokens, batch=batch)
    free()
    return out


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return env


def capture(target: str, conversations: Path, out: Path, *, topk: int, batch_tokens: int, max_length: int) -> dict:
    from eaglekit.artifacts import read_manifest
    from eaglekit.features.capture import capture_features
    from eaglekit.features.conversations import read_conversations, tokenize_conversations
    from eaglekit.targets.info import default_aux_layer_ids
    from eaglekit.targets.load import load_target

    if (out / "manifest.json").is_file() and read_manifest(out).get("complete"):
        return {"reused": True, **read_manifest(out)["counts"]}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = load_target(target, device=device)
    rows, fp = read_conversations(conversations, target_fingerprint=t.fingerprint())
    samples, _ = tokenize_conversations(t.tokenizer, rows, max_length=max_length)
    sync()
    started = time.perf_counter()
    manifest = capture_features(t, samples, out, aux_layer_ids=default_aux_layer_ids(t.config.num_hidden_layers),
                                topk=topk, batch_tokens=batch_tokens, config={"max_length": max_length},
                                inputs={"data": fp}, progress=False)
    sync()
    seconds = time.perf_counter() - started
    del t
    free()
    c = manifest["counts"]
    return {"seconds": round(seconds, 2), "tokens_per_s": round(c["tokens"] / seconds, 1), **c}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_config(args, out: Path, **kw):
    from eaglekit.train.config import TrainConfig

    base = dict(target=args.target, out=str(out), draft_vocab_size=args.draft_vocab_size, allow_smaller_vocab=True,
                ttt_steps=args.ttt_steps, batch_tokens=args.batch_tokens, max_batch_size=args.max_batch_size,
                max_length=args.max_length, lr=args.lr, val_fraction=args.val_fraction, log_every=args.log_every,
                progress=False, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def throughput(out: Path) -> dict:
    """Median tokens/s over the logged windows after the first (compilation, allocator warm-up)."""
    events = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    rates = [e["tokens_per_s"] for e in events if e["event"] == "train"]
    steady = rates[1:] or rates
    mem = [e.get("max_mem_gib") for e in events if e["event"] == "train" and e.get("max_mem_gib") is not None]
    return {"tokens_per_s": round(statistics.median(steady), 1), "windows": len(rates),
            "max_mem_gib": max(mem) if mem else None}


def timed_train(cfg) -> dict:
    import shutil

    from eaglekit.train.loop import train

    shutil.rmtree(cfg.out, ignore_errors=True)   # a rerun on a warm machine starts the run afresh

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    manifest = train(cfg)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    best = manifest.get("best") or {}
    final = (manifest.get("history") or [{}])[-1]
    free()
    return {"seconds": round(seconds, 2), **throughput(Path(cfg.out)),
            "peak_mem_gib_process": round(peak, 2) if peak is not None else None,
            "val_final": {k: final.get(k) for k in ("step", "acc", "cond_acc", "sim_accept_length", "walk_accept_length",
                                                    "oov_share", "data_greedy_agreement")},
            "val_best": {k: best.get(k) for k in ("step", "sim_accept_length", "walk_accept_length")},
            "baselines": manifest["counts"].get("val_baselines"),
            "draft_vocab": manifest.get("draft_vocab")}


def mode_bench(args, work: Path, conv: Path, feat: Path) -> dict:
    steps = args.steps
    common = dict(max_steps=steps, val_every=steps, save_every=steps)
    offline = timed_train(train_config(args, work / "bench-offline", features=str(feat), **common))
    log(f"offline: {offline['tokens_per_s']} tok/s, peak {offline['peak_mem_gib_process']} GiB")
    online = timed_train(train_config(args, work / "bench-online", data=str(conv), **common))
    log(f"online: {online['tokens_per_s']} tok/s, peak {online['peak_mem_gib_process']} GiB")
    return {"steps": steps, "offline": offline, "online": online}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_train(args, feat: Path, out: Path, steps: int) -> list[str]:
    return ["-m", "eaglekit", "train", "--target", args.target, "--features", str(feat), "--out", str(out),
            "--draft-vocab-size", str(args.draft_vocab_size), "--allow-smaller-vocab", "--ttt-steps", str(args.ttt_steps),
            "--batch-tokens", str(args.batch_tokens), "--max-batch-size", str(args.max_batch_size), "--lr", str(args.lr),
            "--max-steps", str(steps), "--val-every", str(steps), "--save-every", str(steps),
            "--log-every", str(args.log_every), "--val-fraction", str(args.val_fraction), "--no-progress"]


def mode_ddp(args, work: Path, feat: Path) -> dict:
    gpus = torch.cuda.device_count()
    if torch.cuda.is_available() and gpus < 2:   # on CPU both processes use gloo
        raise SystemExit(f"ddp mode needs 2 GPUs, found {gpus}")
    steps = args.steps
    results = {}
    one = timed_train(train_config(args, work / "ddp-1", features=str(feat), max_steps=steps, val_every=steps,
                                   save_every=steps))
    results["gpus_1"] = {k: one[k] for k in ("seconds", "tokens_per_s", "windows", "max_mem_gib")}
    log(f"1 process: {one['tokens_per_s']} tok/s")
    out = work / "ddp-2"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), *cli_train(args, feat, out, steps)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=child_env())
    results["gpus_2"] = {"seconds": round(time.perf_counter() - started, 2), **throughput(out)}
    log(f"2 processes (torchrun): {results['gpus_2']['tokens_per_s']} tok/s")
    results["speedup"] = round(results["gpus_2"]["tokens_per_s"] / results["gpus_1"]["tokens_per_s"], 3)
    results["note"] = "same micro-batch per rank, so 2 GPUs process twice the tokens per optimizer step"
    return results


def export_bf16(run: Path, dest: Path, part_bytes: int) -> dict:
    """The best draft of a run, cast to bf16, as OUT/draft/{config.json, manifest.json, model.safetensors[.part-N]}."""
    from eaglekit.draft.checkpoint import load_draft, save_draft

    dest.mkdir(parents=True, exist_ok=True)
    draft = load_draft(run)
    save_draft(draft, dest, dtype=torch.bfloat16)
    (dest / "manifest.json").write_bytes((run / "manifest.json").read_bytes())
    weights = dest / "model.safetensors"
    data = weights.read_bytes()
    info = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": []}
    if len(data) > part_bytes:
        for i in range(0, len(data), part_bytes):
            part = dest / f"model.safetensors.part-{i // part_bytes}"
            part.write_bytes(data[i:i + part_bytes])
            info["parts"].append(part.name)
        weights.unlink()
        info["reassemble"] = "cat model.safetensors.part-* > model.safetensors (parts sort by index < 10)"
    return info


def mode_full(args, work: Path, conv: Path, feat: Path, capture_seconds: float, out: Path) -> dict:
    budget = args.time_budget_s - capture_seconds - args.reserve_s
    if budget <= 10:
        raise SystemExit(f"the time budget {args.time_budget_s} s leaves {budget:.0f} s for training after capture")
    run = work / "full"
    cfg = train_config(args, run, features=str(feat), epochs=args.epochs, time_budget_s=budget,
                       val_every=args.val_every, save_every=args.val_every, val_max_samples=args.val_max_samples)
    result = timed_train(cfg)
    result["export"] = export_bf16(run, out / "draft", int(args.part_mib * 2**20))
    log(f"full: best {result['val_best']}, exported to {out / 'draft'}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="bench", help="bench, ddp, full (comma-separated)")
    p.add_argument("--target", default="smollm2", help="HF folder or .gguf of the target")
    p.add_argument("--conversations", help="conversations folder (default: synthesize and generate them)")
    p.add_argument("--num-conversations", type=int, default=2048, help="when generating them here")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--work", default="/tmp/ek-train-draft", help="scratch folder (features, runs)")
    p.add_argument("--steps", type=int, default=200, help="bench/ddp: optimizer steps per run")
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--draft-vocab-size", type=int, default=16384)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--teacher-topk", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--epochs", type=float, default=30.0, help="full: upper bound; the time budget decides")
    p.add_argument("--time-budget-s", type=float, default=600.0, help="full: capture + training + export")
    p.add_argument("--reserve-s", type=float, default=30.0, help="full: kept for export and slack")
    p.add_argument("--val-fraction", type=float, default=0.03)
    p.add_argument("--val-every", type=int, default=300)
    p.add_argument("--val-max-samples", type=int, default=256)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--part-mib", type=float, default=15.0, help="full: split the exported weights above this size")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny random target, seconds")
    args = p.parse_args()
    started = time.perf_counter()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        torch.set_num_threads(1)
        args.target = smoke_target(work)
        args.num_conversations, args.max_new_tokens = min(args.num_conversations, 48), min(args.max_new_tokens, 24)
        args.steps, args.batch_tokens, args.ttt_steps = min(args.steps, 6), min(args.batch_tokens, 1024), min(args.ttt_steps, 3)
        args.draft_vocab_size, args.log_every, args.val_every = min(args.draft_vocab_size, 128), 2, min(args.val_every, 4)
        args.val_fraction, args.epochs, args.reserve_s = max(args.val_fraction, 0.1), min(args.epochs, 3.0), 5.0
    elif args.target == "smollm2" or args.target.endswith(".gguf"):
        # Dequantize once into an HF folder: every later load (capture, training, online) is then fast.
        from eaglekit.targets.prepare import prepare_target

        prepared = work / "target-hf"
        if not (prepared / "config.json").is_file():
            prepare_target(args.target, prepared, overwrite=True)
        args.target = str(prepared)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    unknown = set(modes) - {"bench", "ddp", "full"}
    if unknown:
        raise SystemExit(f"unknown mode(s) {sorted(unknown)}")
    results: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                     "gpus": torch.cuda.device_count(), "torch": torch.__version__,
                     "date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    conv = Path(args.conversations) if args.conversations else make_conversations(
        args.target, work / "conversations", args.num_conversations, args.max_new_tokens, 128 if not args.smoke else 24)
    results["capture"] = capture(args.target, conv, work / "features", topk=args.teacher_topk,
                                 batch_tokens=args.batch_tokens * 2, max_length=args.max_length)
    log(f"features: {results['capture']}")
    for mode in modes:
        if mode == "bench":
            results["bench"] = mode_bench(args, work, conv, work / "features")
        elif mode == "ddp":
            results["ddp"] = mode_ddp(args, work, work / "features")
        elif mode == "full":
            results["full"] = mode_full(args, work, conv, work / "features", results["capture"].get("seconds", 0.0), out)
        (out / "train_draft.json").write_text(json.dumps(results, indent=2) + "\n")
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    (out / "train_draft.json").write_text(json.dumps(results, indent=2) + "\n")
    log(f"done in {results['total_seconds']} s -> {out / 'train_draft.json'}")


if __name__ == "__main__":
    main()
