"""`eaglekit features`: capture the offline feature store (aux states + top-k teacher)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    from eaglekit.features.options import GROUPS, FeaturesOptions
    from eaglekit.options import add_options

    p = sub.add_parser("features", help="capture aux states + teacher of conversations into a feature store",
                       description="Run the target once over the conversations and store what training needs: "
                                   "its aux states (bf16) and its top-k next-token distribution. Resumable: rerun "
                                   "the same command after a kill and finished shards are kept.")
    add_options(p, FeaturesOptions, GROUPS)
    p.set_defaults(func=run_features)


def run_features(args: argparse.Namespace) -> int:
    from eaglekit.targets.load import load_target, resolve_device

    if args.backend == "vllm":
        from eaglekit.features.vllm_capture import run_features_vllm

        return run_features_vllm(args)
    device = resolve_device(args.device)
    target = load_target(args.target, device=device, dtype=args.dtype, device_map=args.device_map)
    manifest = capture_conversations(args, target)
    c = manifest["counts"]
    print(f"features: {c['samples']} conversations, {c['tokens']} tokens in {c['shards']} shards -> {args.out} "
          f"({c['bytes_per_token']} bytes/token; 8*hidden baseline {c['baseline_bytes_per_token']})")
    return 0


def capture_conversations(args: argparse.Namespace, target, *, config: dict | None = None,
                          shard_capture_for=None) -> dict:
    """The stage's flow for either backend: the aux layers, the conversations tokenized as training
    reads them, the capture into `args.out`; returns the store's manifest.
    `shard_capture_for(aux_layer_ids, samples)` gives the backend's shard function (None: the HF
    target in this process); `config`: the backend's own settings for the manifest."""
    from eaglekit.errors import EaglekitError
    from eaglekit.features.capture import capture_features
    from eaglekit.features.conversations import read_conversations, tokenize_conversations
    from eaglekit.targets.info import check_aux_layer_ids, default_aux_layer_ids

    layers = target.config.num_hidden_layers
    aux = check_aux_layer_ids(args.aux_layer_ids or default_aux_layer_ids(layers), layers)
    rows, data_fp = read_conversations(args.data, target_fingerprint=target.fingerprint())
    samples, _ = tokenize_conversations(target.tokenizer, rows, max_length=args.max_length)
    if not samples:
        raise EaglekitError(f"{args.data} holds no conversations with an answer to learn from",
                            hint="run eaglekit generate first")
    shard_capture = shard_capture_for(aux, samples) if shard_capture_for else None
    return capture_features(target, samples, args.out, aux_layer_ids=aux, topk=args.teacher_topk,
                            shard_tokens=args.shard_tokens, batch_tokens=args.batch_tokens,
                            config={"max_length": args.max_length, **(config or {})}, inputs={"data": data_fp},
                            overwrite=args.overwrite, progress=args.progress, shard_capture=shard_capture)
