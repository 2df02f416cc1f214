"""Offline capture: run the target once over the conversations and write the feature store.

Shards are planned up front from the tokenized lengths (consecutive samples up to `shard_tokens`),
so a rerun with the same inputs plans the same shards: a killed capture resumes by skipping the
shards its index lists, and refuses to resume into a folder made with other settings.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglekit.artifacts import MANIFEST, atomic_path, read_manifest, write_json, write_manifest, writer_lock
from eaglekit.errors import DiskFull, EaglekitError, from_os_error
from eaglekit.features.batch import pack_by_tokens, pad_stack
from eaglekit.features.conversations import Sample, read_conversations, tokenize_conversations
from eaglekit.features.options import FeaturesOptions
from eaglekit.features.store import FORMAT, INDEX, TENSORS, describe_nonfinite, nonfinite_counts, read_index, shard_name
from eaglekit.features.teacher import topk_from_logits
from eaglekit.progress import Progress
from eaglekit.targets.aux import check_aux_layer_ids, default_aux_layer_ids
from eaglekit.targets.capture import capture_aux_states
from eaglekit.targets.source import validate_safetensors

log = logging.getLogger(__name__)


def plan_shards(lengths: list[int], shard_tokens: int) -> list[list[int]]:
    """Consecutive sample indices per shard, each shard up to `shard_tokens` tokens (at least one sample)."""
    shards: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if current and tokens + n > shard_tokens:
            shards.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        shards.append(current)
    return shards


@torch.no_grad()
def capture_shard(
    model, samples: list[Sample], *, aux_layer_ids: list[int], topk: int, batch_tokens: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Aux states and top-k teacher of consecutive samples, as one shard's tensors (CPU)."""
    lengths = [s.length for s in samples]
    per_sample: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    for group in pack_by_tokens(range(len(samples)), lengths, batch_tokens=batch_tokens):
        T = max(lengths[i] for i in group)
        ids = pad_stack([samples[i].input_ids for i in group], T).to(device)  # [B, T]
        mask = pad_stack([torch.ones(lengths[i], dtype=torch.long) for i in group], T).to(device)
        cap = capture_aux_states(model, ids, aux_layer_ids, attention_mask=mask, return_logits=True)
        for row, i in enumerate(group):
            n = lengths[i]
            top_ids, top_logp = topk_from_logits(cap.logits[row, :n], topk)
            per_sample[i] = (cap.aux_hidden[row, :n].to(torch.bfloat16).cpu(), top_ids.cpu(), top_logp.cpu())
    return shard_tensors(samples, [per_sample[i] for i in range(len(samples))])


def shard_tensors(
    samples: list[Sample], captured: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """One shard's tensors (`TENSORS`) from its samples and each sample's captured (aux [T, k*H] bf16,
    top-k ids [T, K], top-k log-probs [T, K]), whichever engine captured them."""
    for sample, (aux, _, logp) in zip(samples, captured):
        bad = nonfinite_counts({"aux": aux, "topk_logp": logp})
        if bad:
            raise EaglekitError(
                f"the target computed {describe_nonfinite(bad)} for conversation {sample.id!r}; "
                f"features holding them would train a NaN draft",
                hint="the target overflows in its dtype: capture with --dtype bfloat16 or float32 "
                "(float16 overflows in many models), or check the target's weights",
            )
    offsets = torch.zeros(len(samples) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor([s.length for s in samples]).cumsum(0)
    return {
        "input_ids": torch.cat([s.input_ids for s in samples]).to(torch.int32),
        "loss_mask": torch.cat([s.loss_mask for s in samples]).to(torch.uint8),
        "offsets": offsets,
        "aux": torch.cat([c[0] for c in captured]),
        "topk_ids": torch.cat([c[1] for c in captured]),
        "topk_logp": torch.cat([c[2] for c in captured]),
    }


def done_shards(out: Path, plan: list[list[int]], samples: list[Sample]) -> dict[str, dict]:
    """Index entries of shards already captured that still match the plan (checked on disk)."""
    done = {}
    for entry in read_index(out)["shards"]:
        n = int(entry["file"].split("-")[1].split(".")[0])
        planned = [samples[i].id for i in plan[n]] if n < len(plan) else None
        if entry["ids"] != planned:
            raise EaglekitError(
                f"{out} holds shard {entry['file']} of other conversations",
                hint="use a new output folder, or --overwrite to recapture",
            )
        validate_safetensors(out / entry["file"])
        done[entry["file"]] = entry
    return done


def capture_features(target, samples: list[Sample], out: str | Path, **kwargs) -> dict:
    """`capture_into` holding `out`'s writer lock: a second capture into the same folder is refused."""
    with writer_lock(out, stage="features"):
        return capture_into(target, samples, Path(out), **kwargs)


def capture_into(
    target,
    samples: list[Sample],
    out: str | Path,
    *,
    aux_layer_ids: list[int],
    topk: int = FeaturesOptions.teacher_topk,
    shard_tokens: int = FeaturesOptions.shard_tokens,
    batch_tokens: int = FeaturesOptions.batch_tokens,
    config: dict | None = None,
    inputs: dict | None = None,
    overwrite: bool = False,
    progress: bool = True,
    shard_capture=None,
) -> dict:
    """Capture (or finish capturing) the offline features of `samples` into `out`.

    Args:
        target: a loaded `Target` (model on its device).
        samples: tokenized conversations, in a fixed order.
        out: the output folder.
        aux_layer_ids: eaglekit convention ids.
        topk: teacher entries per token (over the full target vocabulary).
        shard_tokens: tokens per shard (about bytes_per_token x this many bytes a file).
        batch_tokens: rows x padded length per target forward.
        config: extra resolved settings to record (max_length, data path ...).
        inputs: input fingerprints for the manifest.
        overwrite: clear a folder made with other settings instead of refusing it.
        shard_capture: samples -> one shard's tensors, in place of HF capture with `target.model`
            (`eaglekit.features.vllm_capture`: the target runs in vLLM).

    Returns:
        The final manifest.
    """
    out = Path(out)
    cfg = target.config
    resolved = {
        "aux_layer_ids": list(aux_layer_ids),
        "teacher_topk": int(topk),
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "shard_tokens": int(shard_tokens),
        "aux_dtype": "bfloat16",
        "teacher": "topk over the full target vocab: int32 ids + float16 log-probs",
        "stop_token_ids": list(target.stop_token_ids),
        **(config or {}),
    }
    if topk < 1 or topk > cfg.vocab_size:
        raise EaglekitError(f"teacher top-k {topk} must be in 1..{cfg.vocab_size}", hint="e.g. --teacher-topk 32")
    fingerprint = target.fingerprint()
    if (out / MANIFEST).is_file():
        old = read_manifest(out, stage="features")
        same = (
            old.get("config") == resolved and old.get("target") == fingerprint and old.get("inputs") == (inputs or {})
        )
        if not same and not overwrite:
            raise EaglekitError(
                f"{out} holds features made with other settings, target or data",
                hint="use a new --out folder, or pass --overwrite to replace them",
            )
        if not same:
            clear_store(out)
    elif out.exists() and any(out.iterdir()) and not overwrite:
        raise EaglekitError(f"{out} exists and is not a features folder", hint="use a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_shards([s.length for s in samples], shard_tokens)
    done = done_shards(out, plan, samples)
    counts = {
        "samples": len(samples),
        "shards": len(plan),
        "tokens": sum(s.length for s in samples),
        "assistant_tokens": int(sum(int(s.loss_mask.sum()) for s in samples)),
    }
    write_manifest(
        out,
        stage="features",
        config=resolved,
        target=fingerprint,
        inputs=inputs,
        counts=counts,
        extra={"complete": False},
    )
    if shard_capture is None:
        model = target.model
        device = model.get_input_embeddings().weight.device  # sharded targets (device_map): the first device

        def shard_capture(shard_samples):
            return capture_shard(
                model,
                shard_samples,
                aux_layer_ids=list(aux_layer_ids),
                topk=topk,
                batch_tokens=batch_tokens,
                device=device,
            )

    started, new_tokens = time.perf_counter(), 0
    bar = Progress(len(plan), done=len(done), desc="capture", unit="shard", enabled=progress)
    entries = dict(done)
    for n, members in enumerate(plan):
        name = shard_name(n)
        if name in entries:
            continue
        shard_samples = [samples[i] for i in members]
        tensors = shard_capture(shard_samples)
        try:
            with atomic_path(out / name) as tmp:
                save_file({k: tensors[k].contiguous() for k in TENSORS}, str(tmp), metadata={"format": FORMAT})
            entry = {
                "file": name,
                "ids": [s.id for s in shard_samples],
                "lengths": [s.length for s in shard_samples],
                "bytes": (out / name).stat().st_size,
                "held_out": [s.id for s in shard_samples if s.held_out],
            }  # the prompts' validation split
            # The index is what readers trust: replaced atomically, only after the shard is whole.
            listed = {**entries, name: entry}
            write_json(out / INDEX, {"format": FORMAT, "shards": [listed[k] for k in sorted(listed)]})
        except Exception as err:
            failed = write_failed(err, out, n, len(plan), kept=len(entries))
            if failed is None:
                raise
            raise failed from err
        entries[name] = entry
        new_tokens += sum(s.length for s in shard_samples)
        bar.update(1, tok_s=f"{new_tokens / (time.perf_counter() - started):,.0f}")
    bar.close()
    counts["teacher_topk_mass"] = round(topk_mass(out, sorted(entries)), 5)
    total_bytes = sum(e["bytes"] for e in entries.values())
    counts["bytes"] = total_bytes
    counts["bytes_per_token"] = round(total_bytes / max(counts["tokens"], 1), 1)
    counts["baseline_bytes_per_token"] = 8 * cfg.hidden_size  # 3 aux + final hidden state, bf16
    return write_manifest(
        out,
        stage="features",
        config=resolved,
        target=fingerprint,
        inputs=inputs,
        counts=counts,
        extra={"complete": True},
    )


def write_failed(err: Exception, out: Path, shard: int, shards: int, *, kept: int) -> EaglekitError | None:
    """A failed shard write as a sentence (None: not the operating system's refusal); disk full says
    what is kept and that the rerun resumes."""
    known = from_os_error(err)
    if isinstance(known, DiskFull):
        return DiskFull(
            f"the disk is full: shard {shard + 1} of {shards} could not be written to {out} "
            f"({kept} finished shards are kept)",
            hint="free space on that disk and run the same command again: it resumes at this shard "
            "(or pass an --out on another disk)",
        )
    return known


def topk_mass(out: Path, files: list[str]) -> float:
    """Mean target probability the stored top-k holds on assistant tokens (1.0 = nothing lost)."""
    total, n = 0.0, 0
    for name in files:
        with safe_open(str(out / name), framework="pt") as f:
            mask = f.get_tensor("loss_mask").bool()
            mass = f.get_tensor("topk_logp").float().exp().sum(-1)
        total += float(mass[mask].sum())
        n += int(mask.sum())
    return total / max(n, 1)


def clear_store(out: Path) -> None:
    for path in [out / MANIFEST, out / INDEX] + list(out.glob("shard-*.safetensors")):  # the manifest first
        path.unlink(missing_ok=True)


def capture_conversations(args, target, *, config: dict | None = None, shard_capture_for=None) -> dict:
    """The stage's flow for either backend: the aux layers, the conversations tokenized as training
    reads them, the capture into `args.out`; returns the store's manifest.
    `shard_capture_for(aux_layer_ids, samples)` gives the backend's shard function (None: the HF
    target in this process); `config`: the backend's own settings for the manifest."""
    layers = target.config.num_hidden_layers
    aux = check_aux_layer_ids(args.aux_layer_ids or default_aux_layer_ids(layers), layers)
    rows, data_fp = read_conversations(args.data, target_fingerprint=target.fingerprint())
    samples, _ = tokenize_conversations(target.tokenizer, rows, max_length=args.max_length)
    if not samples:
        raise EaglekitError(
            f"{args.data} holds no conversations with an answer to learn from", hint="run eaglekit generate first"
        )
    shard_capture = shard_capture_for(aux, samples) if shard_capture_for else None
    return capture_features(
        target,
        samples,
        args.out,
        aux_layer_ids=aux,
        topk=args.teacher_topk,
        shard_tokens=args.shard_tokens,
        batch_tokens=args.batch_tokens,
        config={"max_length": args.max_length, **(config or {})},
        inputs={"data": data_fp},
        overwrite=args.overwrite,
        progress=args.progress,
        shard_capture=shard_capture,
    )
