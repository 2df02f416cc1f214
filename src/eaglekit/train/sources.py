"""Feature sources for training: the same `Batch`es from the offline store or from a live target.

- `OfflineSource` reads stored shards (aux states + top-k teacher) lazily.
- `OnlineSource` keeps the target co-resident and runs it per batch (nothing on disk); its teacher
  is the exact target softmax over the draft vocab. With `--cache-target` (train/target_cache.py) a
  batch the target has already run is read back from host memory instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eaglekit.artifacts import MANIFEST
from eaglekit.draft.vocab import DraftVocab
from eaglekit.features.batch import Batch, pad_stack
from eaglekit.features.conversations import Sample, conversation_files
from eaglekit.features.store import FeatureStore
from eaglekit.features.teacher import dense_teacher, sparse_teacher
from eaglekit.targets.capture import capture_aux_states
from eaglekit.train.target_cache import TargetCache


class OfflineSource:
    """Batches from a `FeatureStore`, restricted to a subset of its samples.

    Args:
        store: the opened store.
        members: indices into the store (e.g. the training or the validation split).
        vocab: the draft vocab (maps the stored target-id teacher to draft ids).
    """

    def __init__(self, store: FeatureStore, members: list[int], vocab: DraftVocab):
        self.store = store
        self.members = list(members)
        all_lengths = store.lengths
        all_ids = store.ids
        self.lengths = [all_lengths[i] for i in self.members]
        self.ids = [all_ids[i] for i in self.members]
        self.target_to_draft = vocab.target_to_draft

    def __len__(self) -> int:
        return len(self.members)

    def token_masks(self):
        """(input_ids, loss_mask) of each member, in member order."""
        wanted = {m: k for k, m in enumerate(self.members)}
        found = [None] * len(self.members)
        for i, pair in enumerate(self.store.token_masks()):
            if i in wanted:
                found[wanted[i]] = pair
        return found

    def batch(self, indices: list[int], device: torch.device) -> Batch:
        rows = [self.store.sample(self.members[i]) for i in indices]
        T = max(r["input_ids"].numel() for r in rows)
        host = {
            "input_ids": pad_stack([r["input_ids"] for r in rows], T),
            "loss_mask": pad_stack([r["loss_mask"] for r in rows], T, False),
            "aux": pad_stack([r["aux"] for r in rows], T),
            "topk_ids": pad_stack([r["topk_ids"] for r in rows], T),
            "topk_logp": pad_stack([r["topk_logp"] for r in rows], T),
            "lengths": torch.tensor([r["input_ids"].numel() for r in rows]),
        }
        if device.type == "cuda":  # page-locked, so the copies run asynchronously
            host = {k: v.pin_memory() for k, v in host.items()}
        dev = {k: v.to(device, non_blocking=True) for k, v in host.items()}
        if self.target_to_draft.device != device:
            self.target_to_draft = self.target_to_draft.to(device)
        teacher = sparse_teacher(dev["topk_ids"], dev["topk_logp"], self.target_to_draft)
        return Batch(
            input_ids=dev["input_ids"],
            loss_mask=dev["loss_mask"],
            aux=dev["aux"],
            teacher=teacher,
            lengths=dev["lengths"],
            host_loss_mask=host["loss_mask"],
        )


class OnlineSource:
    """Batches computed by the co-resident target, one forward per batch.

    Args:
        model: the target model (eval, no grad), on the training device.
        samples: tokenized conversations.
        aux_layer_ids: eaglekit convention ids.
        vocab: the draft vocab.
    """

    def __init__(self, model, samples: list[Sample], aux_layer_ids: list[int], vocab: DraftVocab):
        self.model = model
        self.samples = samples
        self.aux_layer_ids = list(aux_layer_ids)
        self.lengths = [s.length for s in samples]
        self.ids = [s.id for s in samples]
        self.target_device = model.get_input_embeddings().weight.device  # sharded targets: the first device
        self.draft_ids = vocab.draft_ids.to(self.target_device)
        self.cache: TargetCache | None = None  # --cache-target (`attach_target_caches`)

    def __len__(self) -> int:
        return len(self.samples)

    def token_masks(self):
        return [(s.input_ids, s.loss_mask) for s in self.samples]

    @torch.no_grad()
    def batch(self, indices: list[int], device: torch.device) -> Batch:
        rows = [self.samples[i] for i in indices]
        T = max(r.length for r in rows)
        host = {
            "input_ids": pad_stack([r.input_ids for r in rows], T),  # [B, T]
            "loss_mask": pad_stack([r.loss_mask for r in rows], T, False),
            "lengths": torch.tensor([r.length for r in rows]),
        }
        if self.target_device.type == "cuda":  # page-locked: the copies do not wait for the device
            host = {k: v.pin_memory() for k, v in host.items()}
        ids = host["input_ids"].to(self.target_device, non_blocking=True)
        if self.cache is not None and self.cache.holds(indices):
            aux, teacher = self.cached(indices, T)
        else:
            aux, teacher = self.run_target(indices, ids)
        return Batch(
            input_ids=ids.to(device, non_blocking=True),
            loss_mask=host["loss_mask"].to(device, non_blocking=True),
            aux=aux.to(device),
            teacher=teacher.to(device),
            lengths=host["lengths"].to(device, non_blocking=True),
            host_loss_mask=host["loss_mask"],
        )

    def run_target(self, indices: list[int], ids: torch.Tensor):
        """(aux [B, T, A*H], teacher) from the target's forward on ids [B, T]; kept in the cache if on."""
        # No attention mask: the rows are right-padded (features/batch.py), so the causal mask keeps the
        # padding from every real token, and SDPA runs its causal flash kernel, not the masked one.
        cap = capture_aux_states(self.model, ids, self.aux_layer_ids, return_logits=True)
        if self.cache is not None:
            if self.cache.logits_dtype is None:  # the first batch the target runs
                self.cache.check_head(self.model.get_output_embeddings(), cap.logits, cap.last_hidden)
            self.cache.store(indices, cap.aux_hidden, cap.last_hidden)
            self.cache.batches_target += 1
        teacher = dense_teacher(cap.logits, self.draft_ids.to(cap.logits.device))
        del cap.logits
        return cap.aux_hidden, teacher

    def cached(self, indices: list[int], length: int):
        """(aux [B, T, A*H], teacher) read back from the cache: the target does not run."""
        aux, last = self.cache.load(indices, length, self.target_device)  # [B, T, A*H], [B, T, H]
        head = self.model.get_output_embeddings()
        logits = head(last.to(head.weight.device)).to(self.cache.logits_dtype)  # [B, T, V]
        self.cache.batches_cached += 1
        return aux, dense_teacher(logits, self.draft_ids.to(logits.device))


def validation_workload(cfg, val: OfflineSource | OnlineSource | None) -> dict | None:
    """What the validation set is: where it comes from, its conversations by source (the prompts'
    `source`), and a label for the accept length it predicts, which holds for that workload alone (a
    held-out share of a FLAN/T0/GSM8K mix predicted far more than MT-bench then accepted). None
    without a validation set.

    Args:
        cfg: the run's `TrainConfig` (which inputs it read).
        val: the validation source as the run will use it (after `--val-max-samples`).
    """
    if val is None:
        return None
    if cfg.val_data:
        origin, where = "val_data", cfg.val_data
    else:
        origin, where = "held_out", cfg.data if cfg.online else cfg.features
    names = sources_by_id(where, online=cfg.online)
    by_source: dict[str, int] = {}
    for sid in val.ids:
        name = names.get(sid, "unknown")
        by_source[name] = by_source.get(name, 0) + 1
    by_source = dict(sorted(by_source.items(), key=lambda kv: (-kv[1], kv[0])))
    shown = ", ".join(f"{name} {n}" for name, n in list(by_source.items())[:4])
    more = len(by_source) - 4
    label = f"{'--val-data' if origin == 'val_data' else 'held-out'} conversations: {shown}" + (
        f" and {more} more sources" if more > 0 else ""
    )
    return {"origin": origin, "path": str(where), "conversations": len(val.ids), "by_source": by_source, "label": label}


def sources_by_id(path, *, online: bool) -> dict[str, str]:
    """Conversation id -> its prompt's `source`, read from the conversations folder (offline: the one
    the features were captured from, named in their manifest); empty where that folder is gone."""
    folder = Path(path)
    if not online:
        manifest = folder / MANIFEST
        data = (json.loads(manifest.read_text()).get("inputs") or {}).get("data") if manifest.is_file() else None
        if not isinstance(data, dict) or not data.get("path"):
            return {}
        folder = Path(data["path"])
    if not folder.exists():
        return {}
    files, _ = conversation_files(folder)
    names: dict[str, str] = {}
    for file in files:
        with open(file, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    if isinstance(row, dict) and "id" in row:
                        names[str(row["id"])] = str(row.get("source") or "unknown")
    return names
