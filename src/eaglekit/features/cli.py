"""`eaglekit features`: capture the offline feature store (aux states + top-k teacher)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def register(sub) -> None:
    p = sub.add_parser("features", help="capture aux states + teacher of conversations into a feature store",
                       description="Run the target once over the conversations and store what training needs: "
                                   "its aux states (bf16) and its top-k next-token distribution. Resumable: rerun "
                                   "the same command after a kill and finished shards are kept.")
    p.add_argument("--target", default="smollm2", help="smollm2, an HF model folder or a .gguf file")
    p.add_argument("--data", required=True, help="conversations folder (eaglekit generate) or a .jsonl file")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--aux-layer-ids", type=int_list, default=None,
                   help="comma-separated ids, output of 0-based layer i (default [1, N//2-1, N-4])")
    p.add_argument("--teacher-topk", type=int, default=32, help="teacher entries per token (default 32)")
    p.add_argument("--max-length", type=int, default=2048, help="truncate conversations to this many tokens")
    p.add_argument("--shard-tokens", type=int, default=262144, help="tokens per shard file")
    p.add_argument("--batch-tokens", type=int, default=8192, help="rows x padded length per target forward")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1")
    p.add_argument("--dtype", default="auto", help="target dtype: auto (bf16 on GPU), float32, bfloat16")
    p.add_argument("--device-map", default=None,
                   help="shard a target too large for one GPU over all GPUs (e.g. auto; transformers/accelerate)")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"),
                   help="hf: transformers forward hooks (default); vllm: the target runs in vLLM (offline LLM, "
                        "--tensor-parallel-size GPUs), same shards (docs/vllm-backends.md)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm backend: GPUs the target is split over")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vllm backend: share of GPU memory vLLM may take (on its CPU build: of RAM for the KV cache)")
    p.add_argument("--overwrite", action="store_true", help="replace features made with other settings")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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
                            overwrite=args.overwrite, progress=not args.no_progress, shard_capture=shard_capture)
