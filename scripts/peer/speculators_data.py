"""Turn eaglekit's regenerated conversations into the offline input of vLLM's `speculators` trainer.

Runs in eaglekit's venv; `speculators` itself runs in its own (scripts/peer/run_speculators.sh).
Two steps, with the peer's own `speculators prepare_data` between them:

  tokens  CONV --target T --out W/tokens.jsonl
          the conversations tokenized exactly as `eaglekit features` / `train` read them
          ({"id", "input_ids", "loss_mask"} per line): both trainers see the same tokens and masks.
  (peer)  speculators prepare_data --data W/tokens.jsonl --output W/data ...
          passes pre-tokenized rows through, writes the HF dataset and token_freq.pt.
  hidden  W/data --target T
          one target forward per row of that dataset, written as speculators' offline hidden-state
          files W/data/hidden_states/hs_{i}.safetensors: {"hidden_states": [T, 4, H] bf16,
          "token_ids": [T] int64}. Layers 0-2 are the aux states, layer 3 the last decoder layer's
          output before the final norm (speculators applies the target's norm and lm_head itself).

The hidden states are what vLLM's `extract_hidden_states` would write; capturing them with eaglekit's
HF hooks means the peer needs no vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglekit.errors import EaglekitError


def write_tokens(conversations: str, target_spec: str, out: Path, max_length: int) -> int:
    """Write the tokenized conversations (ids + assistant masks) as JSONL; return the row count."""
    from eaglekit.features.conversations import read_conversations, tokenize_conversations
    from eaglekit.targets.load import load_tokenizer
    from eaglekit.targets.source import resolve_target

    source = resolve_target(target_spec)
    tokenizer = load_tokenizer(source)
    rows, _ = read_conversations(conversations)
    samples, counts = tokenize_conversations(tokenizer, rows, max_length=max_length)
    samples = [s for s in samples if not s.held_out]  # eaglekit's training leaves these out too
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for s in samples:
            f.write(
                json.dumps(
                    {"id": s.id, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.to(torch.int64).tolist()}
                )
                + "\n"
            )
    print(
        f"tokens: {len(samples)} conversations, {sum(s.length for s in samples)} tokens "
        f"({counts['assistant_tokens']} assistant) -> {out}"
    )
    return len(samples)


def read_prepared(data: Path) -> list[list[int]]:
    """The input_ids of `speculators prepare_data`'s dataset, in its row order (= hs file index)."""
    import pyarrow as pa

    files = sorted(data.glob("data-*.arrow"))
    if not files:
        raise EaglekitError(
            f"{data} holds no data-*.arrow files",
            hint="run `speculators prepare_data --data W/tokens.jsonl --output W/data` first",
        )
    ids: list[list[int]] = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            table = pa.ipc.open_stream(source).read_all()
        ids += table.column("input_ids").to_pylist()
    return ids


def parse_ids(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@torch.no_grad()
def write_hidden(
    data: Path, target_spec: str, *, aux_layer_ids: list[int] | None, device: str, dtype: str, batch_tokens: int
) -> int:
    """Capture aux + last-layer states for every prepared row; return the number written.

    Rows of similar length go through the target together (sorted by length, right-padded: causal
    attention keeps the padding from every real token), at most `batch_tokens` padded tokens a batch:
    one row at a time, a small target's forward is all launch overhead."""
    from eaglekit.targets.capture import capture_aux_states
    from eaglekit.targets.info import check_aux_layer_ids, default_aux_layer_ids
    from eaglekit.targets.load import load_target

    target = load_target(target_spec, device=device, dtype=dtype)
    layers = target.config.num_hidden_layers
    aux = check_aux_layer_ids(aux_layer_ids or default_aux_layer_ids(layers), layers)
    captured = aux + [layers - 1]  # speculators' last slot: the final decoder layer, pre-norm
    hidden = target.config.hidden_size
    out = data / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_prepared(data)
    todo = sorted(
        (i for i in range(len(rows)) if not (out / f"hs_{i}.safetensors").is_file()),  # resumable
        key=lambda i: len(rows[i]),
    )
    start = time.perf_counter()
    while todo:
        longest = len(rows[todo[-1]])
        batch = todo[-max(1, batch_tokens // longest) :]  # the longest rows left, padded to the longest
        todo = todo[: -len(batch)]
        input_ids = torch.zeros(len(batch), longest, dtype=torch.long)  # [B, T], right-padded
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for r, i in enumerate(batch):
            input_ids[r, : len(rows[i])] = torch.tensor(rows[i])
            mask[r, : len(rows[i])] = 1
        states = capture_aux_states(
            target.model,
            input_ids.to(target.device),
            captured,
            attention_mask=mask.to(target.device),
            return_logits=False,
        )
        stacked = states.aux_hidden.view(len(batch), longest, len(captured), hidden).to(torch.bfloat16).cpu()
        for r, i in enumerate(batch):  # [T_i, 4, H] each
            n = len(rows[i])
            save_file(
                {"hidden_states": stacked[r, :n].contiguous(), "token_ids": input_ids[r, :n].clone()},
                str(out / f"hs_{i}.safetensors"),
            )
    took = time.perf_counter() - start
    print(
        f"hidden: {len(rows)} rows, {sum(map(len, rows))} tokens, layers {captured} (eaglekit convention: "
        f"output of layer i) -> {out} in {took:.1f}s"
    )
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens", help="conversations -> pre-tokenized JSONL for `speculators prepare_data`")
    t.add_argument("conversations", help="a generate folder or a conversations .jsonl")
    t.add_argument("--target", required=True)
    t.add_argument("--out", required=True, type=Path)
    t.add_argument("--max-length", type=int, default=2048, help="truncate as `eaglekit features` does")
    h = sub.add_parser("hidden", help="capture hidden states for a prepared speculators dataset")
    h.add_argument("data", type=Path, help="the `speculators prepare_data` output folder")
    h.add_argument("--target", required=True)
    h.add_argument(
        "--aux-layer-ids",
        type=parse_ids,
        default=None,
        help="eaglekit convention (output of layer i); default the target's EAGLE-3 layers",
    )
    h.add_argument("--device", default="cpu")
    h.add_argument("--dtype", default="auto")
    h.add_argument("--batch-tokens", type=int, default=32768, help="padded tokens per target forward")
    args = p.parse_args(argv)
    try:
        if args.cmd == "tokens":
            write_tokens(args.conversations, args.target, args.out, args.max_length)
        else:
            write_hidden(
                args.data,
                args.target,
                aux_layer_ids=args.aux_layer_ids,
                device=args.device,
                dtype=args.dtype,
                batch_tokens=args.batch_tokens,
            )
    except EaglekitError as err:
        print(f"error: {err.message}\n  hint: {err.hint}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
