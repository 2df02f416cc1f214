"""`eaglekit train`: TTT training of an EAGLE-3 draft (offline from features, or online from conversations).

Multi-GPU: `torchrun --nproc_per_node N -m eaglekit train ...` (DDP, one replica per GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from eaglekit.features.cli import int_list


def register(sub) -> None:
    p = sub.add_parser("train", help="train a draft with training-time test (TTT)",
                       description="Train an EAGLE-3 draft. Offline: --features DIR (from `eaglekit features`). "
                                   "Online: --data CONVERSATIONS, the target runs beside the draft. Writes the best "
                                   "draft (by simulated accept length on held-out data) to --out.")
    src = p.add_argument_group("inputs")
    src.add_argument("--target", default="smollm2", help="smollm2, an HF model folder or a .gguf file")
    src.add_argument("--features", help="offline: feature folder from `eaglekit features`")
    src.add_argument("--data", help="online: conversations folder or .jsonl (target runs per batch)")
    src.add_argument("--val-data", help="held-out conversations (online) or features (offline)")
    src.add_argument("--val-fraction", type=float, default=0.05, help="else hold out this share, split by id")
    src.add_argument("--val-max-samples", type=int, default=None, help="validate on at most this many samples")
    src.add_argument("--train-fraction", type=float, default=1.0,
                     help="train on this hash-stable share of the training samples (a smaller share is a subset "
                          "of a larger one; validation is unchanged): the slices of a data-scaling curve")
    src.add_argument("--allow-partial-features", action="store_true",
                     help="train on the finished shards of a capture that is still running")
    src.add_argument("--out", required=True, help="output folder (the draft checkpoint + trainer state)")
    d = p.add_argument_group("draft")
    d.add_argument("--vocab", help="vocab.safetensors or folder from `eaglekit vocab` (default: built from the data)")
    d.add_argument("--init-from", help="start from this native draft (weights and vocab); with --max-steps 0 "
                                       "only validate it")
    d.add_argument("--draft-vocab-size", type=int, default=32000, help="rows of the draft lm_head (default 32000)")
    d.add_argument("--allow-smaller-vocab", action="store_true",
                   help="if the data has fewer distinct tokens than --draft-vocab-size, keep them all")
    d.add_argument("--aux-layer-ids", type=int_list, default=None, help="online: comma-separated target layers")
    d.add_argument("--target-device-map", default=None,
                   help="online, one process: shard a target too large for one GPU over all GPUs (e.g. auto)")
    d.add_argument("--lm-head-init", choices=("target", "random"), default="target",
                   help="start lm_head from the target's rows of the draft vocab (default) or randomly")
    t = p.add_argument_group("training")
    t.add_argument("--ttt-steps", type=int, default=7, help="unrolled draft steps (default 7)")
    t.add_argument("--step-decay", type=float, default=0.8, help="loss weight of step j is decay**j")
    t.add_argument("--max-length", type=int, default=2048, help="online: truncate conversations")
    t.add_argument("--batch-tokens", type=int, default=8192, help="rows x padded length per micro-batch")
    t.add_argument("--max-batch-size", type=int, default=64, help="rows per micro-batch at most")
    t.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step and rank")
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--max-steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    t.add_argument("--time-budget-s", type=float, default=None, help="fit the run into this many seconds")
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--min-lr-ratio", type=float, default=0.05)
    t.add_argument("--schedule", choices=("cosine", "linear", "constant"), default="cosine")
    t.add_argument("--warmup-steps", type=int, default=None, help="default: 2%% of the steps")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--max-grad-norm", type=float, default=0.5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto", help="auto, cpu, cuda")
    t.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 autocast on GPU, fp32 on CPU")
    r = p.add_argument_group("reporting")
    r.add_argument("--val-every", type=int, default=200, help="validate every N steps (and at the end)")
    r.add_argument("--save-every", type=int, default=200, help="write the resume state every N steps")
    r.add_argument("--log-every", type=int, default=10)
    r.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    r.add_argument("--overwrite", action="store_true", help="delete the run in --out and start over")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train)


def config_from_args(args: argparse.Namespace):
    from eaglekit.train.config import TrainConfig

    return TrainConfig(
        target=args.target, out=args.out, features=args.features, data=args.data, val_data=args.val_data,
        val_fraction=args.val_fraction, train_fraction=args.train_fraction,
        allow_partial_features=args.allow_partial_features, vocab=args.vocab,
        init_from=args.init_from,
        draft_vocab_size=args.draft_vocab_size, allow_smaller_vocab=args.allow_smaller_vocab,
        aux_layer_ids=tuple(args.aux_layer_ids) if args.aux_layer_ids else None,
        target_device_map=args.target_device_map, ttt_steps=args.ttt_steps,
        step_decay=args.step_decay, lm_head_init=args.lm_head_init, max_length=args.max_length,
        batch_tokens=args.batch_tokens, max_batch_size=args.max_batch_size, grad_accum=args.grad_accum,
        epochs=args.epochs, max_steps=args.max_steps, time_budget_s=args.time_budget_s, lr=args.lr,
        min_lr_ratio=args.min_lr_ratio, schedule=args.schedule, warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, val_every=args.val_every,
        val_max_samples=args.val_max_samples, save_every=args.save_every, log_every=args.log_every,
        seed=args.seed, device=args.device, precision=args.precision, resume=args.resume, overwrite=args.overwrite,
        progress=not args.no_progress)


def run_train(args: argparse.Namespace) -> int:
    from eaglekit.train.loop import train

    manifest = train(config_from_args(args))
    if manifest:
        best = manifest.get("best") or {}
        print(json.dumps({"out": args.out, "best_step": best.get("step"),
                          "walk_accept_length": best.get("walk_accept_length"),
                          "sim_accept_length": best.get("sim_accept_length"), "acc": best.get("acc"),
                          "draft_vocab_coverage": manifest["counts"].get("draft_vocab_coverage")}))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank_now()
    return 0


def exit_rank_now() -> None:
    """End a finished torchrun rank without running C++ destructors. Everything is written and the
    process group destroyed, yet on a loaded CPU a gloo rank sometimes aborted while exiting
    ("terminate called without an active exception": a joinable thread destroyed at exit), which
    torchrun reports as a failed run."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
