"""One draft training step (unroll + loss + backward + AdamW), timed per implementation variant.

A SmolLM2-135M-shaped draft (hidden 576, 9/3 heads, MLP 1536, vocab 49152; built from numbers, no
download) on synthetic batches of the online recipe's shape: `--batch-tokens` / `--length` rows of
`--length` tokens, a dense teacher over `--draft-vocab-size` ids, bf16 autocast on GPU. The target
forward of online training is not part of it (it is the same in every variant).

Variants (comma-separated `--variants`); each runs TTT steps 1.., the head and the loss at the
positions some TTT step counts only (`ttt_positions`). Those that lost their A/B are gone (the dense
attention eager, the head on every position: docs/notes/training.md, "What was tried"):
  merged         merged attention (causal flash kernel + own chain by log-sum-exp) + plain CE, eager
                 (the default of `eaglekit train`)
  new            merged attention + the fused soft CE, eager (`train --soft-ce fused`)
  cce            merged attention + the soft CE alone under torch.compile (`train --soft-ce compiled`)
  merged-target  merged, with the target's layers alone under torch.compile (with --target; the draft's
                 step eager): what compiling the online target's forward alone would buy
  new-compile    `eaglekit train --compile`: merged attention, each TTT step's work under torch.compile
                 (`ttt.compiled_steps`; at 6331a2d the whole unroll + loss as one graph), and with --target
                 the target's layers (which stay compiled: list compiled variants last); `first_step_s`
                 holds the compile
  dense-compile  dense attention under torch.compile
Each prints ms/step (median of --steps after warm-up) and the peak device memory of a step, and
checks that its loss matches the first variant's on the same batch.

`--mix N` replaces the one fixed shape by N batches of seeded, varied sample lengths (median ~300,
mean ~450, at most --length, like the recipe's conversations) grouped as `eaglekit train` groups them
(rows x longest <= --batch-tokens), taken in turn: a new [rows, T] shape every step, as in a real
run; the warm-up visits every shape once. Rows are right-padded to their batch's longest, and the
last `--answer-share` of each sample's tokens are the assistant's (the ones the loss counts). `--target DIR` (with --mix) also runs the online part, the
target's forward and dense teacher on those rows through the product's OnlineSource, timed apart
(`target_ms`). tokens_per_s is the timed steps' tokens (padded) over their total time.

GPU:  python scripts/gpu/bench_train_step.py --out $OUT
CPU:  python scripts/gpu/bench_train_step.py --smoke   (tiny shapes, seconds; what the test runs)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from eaglekit.draft.config import DraftConfig  # noqa: E402
from eaglekit.draft.model import Eagle3Draft  # noqa: E402
from eaglekit.features.batch import Batch, pack_by_tokens  # noqa: E402
from eaglekit.features.conversations import Sample  # noqa: E402
from eaglekit.features.teacher import Teacher  # noqa: E402
from eaglekit.targets.load import resolve_device  # noqa: E402
from eaglekit.train.attention import plan_free_attention  # noqa: E402
from eaglekit.train.config import TrainConfig  # noqa: E402
from eaglekit.train.loop import TTTModel, compile_target_layers, compiled_unrolled_loss, unrolled_loss  # noqa: E402
from eaglekit.train.loss import step_counts  # noqa: E402
from eaglekit.train.optim import make_optimizer  # noqa: E402

VARIANTS = {  # name: (attention, compiled, soft CE, the target's layers compiled)
    "merged": ("merged", False, "plain", False),
    "new": ("merged", False, "fused", False),
    "cce": ("merged", False, "compiled", False),
    "merged-target": ("merged", False, "plain", True),
    "new-compile": ("merged", True, None, True),
    "dense-compile": ("dense", True, None, True),
}
SMOLLM2 = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)


def make_draft(shape, draft_vocab_size: int, device: torch.device) -> Eagle3Draft:
    """A seeded draft for a target config (a dict of Llama numbers, or a real target's config)."""
    from transformers import LlamaConfig

    config = LlamaConfig(**shape) if isinstance(shape, dict) else shape
    layers = config.num_hidden_layers
    cfg = DraftConfig.for_target(config, aux_layer_ids=[1, layers // 2, layers - 3], draft_vocab_size=draft_vocab_size)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    ids = torch.sort(torch.randperm(cfg.vocab_size)[:draft_vocab_size]).values
    from eaglekit.draft.vocab import DraftVocab

    DraftVocab(draft_ids=ids, vocab_size=cfg.vocab_size).apply_to(draft)
    return draft.to(device).train()


def answer_mask(length: int, answer_share: float) -> torch.Tensor:
    """[length] bool: a sample's prompt, then its answer (the last `answer_share` of its tokens)."""
    mask = torch.zeros(length, dtype=torch.bool)
    mask[min(length - 1, round(length * (1 - answer_share))) :] = True
    return mask


def make_batch(draft: Eagle3Draft, lengths: list[int], answer_share: float, device: torch.device) -> Batch:
    """Synthetic rows of these lengths, right-padded to the longest: random tokens and aux states, a
    peaked dense teacher, each row's last `answer_share` of tokens written by the assistant."""
    cfg = draft.config
    g = torch.Generator().manual_seed(1)
    rows, length = len(lengths), max(lengths)
    ids = torch.randint(3, cfg.vocab_size, (rows, length), generator=g)
    mask = torch.zeros(rows, length, dtype=torch.bool)
    for r, n in enumerate(lengths):
        mask[r, :n] = answer_mask(n, answer_share)
    aux = torch.randn(rows, length, cfg.fused_width, generator=g)
    draft_ids = draft.t2d.nonzero().squeeze(1).cpu()
    probs = (torch.randn(rows, length, cfg.draft_vocab_size, generator=g) * 4).softmax(-1)
    argmax = draft_ids[probs.argmax(-1)]
    teacher = Teacher(argmax=argmax, probs=probs)
    return Batch(ids, mask, aux, teacher, torch.tensor(lengths), host_loss_mask=mask).to(device)


def mixed_lengths(count: int, longest: int, seed: int = 2) -> list[int]:
    """Seeded sample lengths, log-normal around 300 tokens (the recipe's conversations: mean 408-624)."""
    g = torch.Generator().manual_seed(seed)
    median = min(300.0, longest / 4)
    raw = torch.exp(torch.randn(count, generator=g) * 0.9 + torch.log(torch.tensor(median)))
    return [int(x) for x in raw.clamp(4, longest)]


def mixed_groups(args) -> tuple[list[int], list[list[int]]]:
    """--mix batches: sample lengths, packed as training packs them (rows x longest <= batch tokens)."""
    lengths = mixed_lengths(2 * args.batch_tokens * args.mix // min(300, args.length // 4), args.length)
    groups = pack_by_tokens(range(len(lengths)), lengths, batch_tokens=args.batch_tokens)
    step = max(1, len(groups) // args.mix)
    return lengths, groups[::step][: args.mix]  # shapes from the longest rows to the shortest


class OnlineRows:
    """--target: the online part, the real target's forward + teacher on random token rows."""

    def __init__(self, target, draft: Eagle3Draft, lengths: list[int], answer_share: float, device: torch.device):
        from eaglekit.draft.vocab import DraftVocab
        from eaglekit.train.sources import OnlineSource

        g = torch.Generator().manual_seed(3)
        samples = []
        for n, length in enumerate(lengths):
            ids = torch.randint(3, draft.config.vocab_size, (length,), generator=g)
            samples.append(Sample(id=str(n), input_ids=ids, loss_mask=answer_mask(length, answer_share)))
        vocab = DraftVocab(draft_ids=draft.t2d.nonzero().squeeze(1).cpu(), vocab_size=draft.config.vocab_size)
        self.source = OnlineSource(target.model, samples, draft.config.aux_layer_ids, vocab)
        self.device = device

    def batch(self, indices: list[int]) -> Batch:
        return self.source.batch(indices, self.device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_batches(args, draft: Eagle3Draft, target, device: torch.device):
    """The batches the timed steps take in turn: one fixed shape, or --mix's varied ones (+ the online rows)."""
    if not args.mix:
        return [make_batch(draft, [args.length] * (args.batch_tokens // args.length), args.answer_share, device)], None
    lengths, groups = mixed_groups(args)
    if target is not None:
        online = OnlineRows(target, draft, lengths, args.answer_share, device)
        return groups, online
    return [make_batch(draft, [lengths[i] for i in g], args.answer_share, device) for g in groups], None


def bench_variant(name: str, args, shape, device: torch.device, autocast: bool, target=None) -> dict:
    attention, compiled, soft_ce, target_compiled = VARIANTS[name]
    draft = make_draft(shape, args.draft_vocab_size, device)
    model = TTTModel(draft, args.ttt_steps, attention)
    params = [(n, p) for n, p in draft.named_parameters() if p.requires_grad]
    optimizer = make_optimizer(
        params, lr=TrainConfig.lr, weight_decay=TrainConfig.weight_decay, betas=TrainConfig.betas
    )
    batches, online = step_batches(args, draft, target, device)
    step_loss = compiled_unrolled_loss() if compiled else unrolled_loss
    if target_compiled and target is not None and not getattr(target, "layers_compiled", False):
        compile_target_layers(target.model)  # as `train --compile` online; it stays so: list compiled variants last
        target.layers_compiled = True
    kw = dict(d2t=draft.d2t, t2d=draft.t2d, weights=[TrainConfig.step_decay**j for j in range(args.ttt_steps)])
    if not compiled and soft_ce != "plain":  # passed only when set: this script also times older src trees
        kw["soft_ce"] = soft_ce
    target_ms, tokens = [], []

    def step(n: int) -> float:
        batch = batches[n % len(batches)]
        if online is not None:  # the target's forward, timed apart from the draft's step
            sync(device)
            t0 = time.perf_counter()
            batch = online.batch(batch)
            sync(device)
            target_ms.append((time.perf_counter() - t0) * 1000)
        tokens.append(int(batch.input_ids.numel()))
        denominators = step_counts(batch.loss_mask, args.ttt_steps)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = step_loss(model, batch, denominators, **kw)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return out.loss.detach()

    started = time.perf_counter()
    first_loss = float(step(0))  # before any update: comparable across variants
    sync(device)
    warmup_s = time.perf_counter() - started
    for n in range(1, args.warmup):
        step(n)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = []
    target_ms.clear()
    tokens.clear()
    for n in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        step(n)
        sync(device)
        times.append((time.perf_counter() - t0) * 1000)
    step_ms = [t - o for t, o in zip(times, target_ms)] if target_ms else times
    result = {
        "variant": name,
        "attention": attention,
        "compile": compiled,
        "first_loss": round(first_loss, 6),
        "ms_per_step": round(statistics.median(times), 2),
        "ms_min": round(min(times), 2),
        "first_step_s": round(warmup_s, 2),
        "shapes": len(batches),
        "tokens_per_s": round(sum(tokens) / (sum(times) / 1000), 1),
    }
    if target_ms:
        result.update(target_ms=round(statistics.median(target_ms), 2), draft_ms=round(statistics.median(step_ms), 2))
    if device.type == "cuda":
        result["peak_step_mem_gib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**30, 3)
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    return result


def free_variant(device: torch.device) -> None:
    """After a variant returned (its draft, optimizer and batch went with its frame): memory and compiles."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="merged,new,cce,new-compile")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--length", type=int, default=2048, help="tokens per row (rows = batch-tokens / length)")
    p.add_argument("--draft-vocab-size", type=int, default=16384)
    p.add_argument("--ttt-steps", type=int, default=TrainConfig.ttt_steps)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, allocator)")
    p.add_argument(
        "--mix", type=int, default=0, help="N batches of varied sample lengths, taken in turn (0: one shape)"
    )
    p.add_argument("--target", default=None, help="with --mix: the real target's forward too (online training)")
    p.add_argument(
        "--answer-share",
        type=float,
        default=0.67,
        help="share of a sample's tokens the assistant wrote, the ones the loss counts (the recipe's "
        "data: 11.55M answer tokens of 17.30M, 2026-12-03)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, fp32")
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(names) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variant(s) {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    shape = SMOLLM2
    if args.smoke:
        shape, args.device = TINY, "cpu"
        args.batch_tokens, args.length, args.draft_vocab_size = 64, 32, 128
        args.ttt_steps, args.steps, args.warmup = 3, 2, 1
        if args.mix:
            args.batch_tokens, args.length = 256, 64
    if args.mix:
        args.warmup = max(args.warmup, args.mix)  # every shape's first visit before the timed steps
    device = torch.device(resolve_device(args.device))
    autocast = device.type == "cuda"
    if args.target and not args.mix:
        raise SystemExit("--target needs --mix N (the online rows are packed from varied lengths)")
    target = None
    if args.target:
        from eaglekit.targets.load import load_target

        target = load_target(args.target, device=str(device), dtype="auto")
        shape = target.model.config
    results = []
    for name in names:
        with plan_free_attention():  # as `train` runs
            r = bench_variant(name, args, shape, device, autocast, target)
        free_variant(device)
        results.append(r)
        print(json.dumps(r), flush=True)
    reference = results[0]["first_loss"]
    tol = 2e-2 if autocast else 1e-4  # bf16 autocast: kernels round differently
    for r in results:
        r["loss_matches_first"] = abs(r["first_loss"] - reference) <= tol * max(1.0, abs(reference))
    summary = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "args": vars(args),
        "results": results,
    }
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_train_step.json").write_text(json.dumps(summary, indent=2) + "\n")
    bad = [r["variant"] for r in results if not r["loss_matches_first"]]
    if bad:
        raise SystemExit(f"loss of {bad} differs from {results[0]['variant']}'s: {results}")
    return results


if __name__ == "__main__":
    main()
