"""`eaglekit features`: capture the offline feature store (aux states + top-k teacher)."""

from __future__ import annotations

import argparse

from eaglekit.features.options import GROUPS, FeaturesOptions
from eaglekit.options import add_options


def register(sub) -> None:
    p = sub.add_parser(
        "features",
        help="capture aux states + teacher of conversations into a feature store",
        description="Run the target once over the conversations and store what training needs: "
        "its aux states (bf16) and its top-k next-token distribution. Resumable: rerun "
        "the same command after a kill and finished shards are kept.",
    )
    add_options(p, FeaturesOptions, GROUPS)
    p.set_defaults(func=run_features)


def run_features(args: argparse.Namespace) -> int:
    from eaglekit.features.capture import capture_conversations
    from eaglekit.targets.load import load_target, resolve_device

    if args.backend == "vllm":
        from eaglekit.features.vllm_capture import run_features_vllm

        return run_features_vllm(args)
    device = resolve_device(args.device)
    target = load_target(args.target, device=device, dtype=args.dtype, device_map=args.device_map)
    manifest = capture_conversations(args, target)
    c = manifest["counts"]
    print(
        f"features: {c['samples']} conversations, {c['tokens']} tokens in {c['shards']} shards -> {args.out} "
        f"({c['bytes_per_token']} bytes/token; 8*hidden baseline {c['baseline_bytes_per_token']})"
    )
    return 0
