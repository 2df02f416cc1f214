"""`eaglekit train`: TTT training of an EAGLE-3 draft (offline from features, or online from conversations).

Multi-GPU: `torchrun --nproc_per_node N -m eaglekit train ...` (DDP, one replica per GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from eaglekit.options import add_options, options_from_args
from eaglekit.train.config import TrainConfig


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a draft with training-time test (TTT)",
        description="Train an EAGLE-3 draft. Offline: --features DIR (from `eaglekit features`). "
        "Online: --data CONVERSATIONS, the target runs beside the draft. Writes the best "
        "draft (by walk tau, the accept length of a greedy draft walk, on held-out data) to --out.",
    )
    add_options(
        p, TrainConfig, groups={"inputs": "inputs", "draft": "draft", "training": "training", "reporting": "reporting"}
    )
    p.set_defaults(func=run_train)


def config_from_args(args: argparse.Namespace):
    return options_from_args(TrainConfig, args)


def run_train(args: argparse.Namespace) -> int:
    from eaglekit.train.loop import train

    manifest = train(config_from_args(args))
    if manifest:
        best = manifest.get("best") or {}
        print(
            json.dumps(
                {
                    "out": args.out,
                    "best_step": best.get("step"),
                    "walk_accept_length": best.get("walk_accept_length"),
                    "sim_accept_length": best.get("sim_accept_length"),
                    "acc": best.get("acc"),
                    "draft_vocab_coverage": manifest["counts"].get("draft_vocab_coverage"),
                }
            )
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank_now()
    return 0


def exit_rank_now() -> None:
    """End a finished torchrun rank without running C++ destructors. Everything is written and the
    process group destroyed, yet on a loaded CPU a gloo rank sometimes aborted while exiting
    ("terminate called without an active exception": a joinable thread destroyed at exit), which
    torchrun reports as a failed run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
