"""The offline feature store: sharded safetensors + `index.json` + `manifest.json`.

One shard holds consecutive conversations, concatenated along the token axis (N tokens, S samples):

    input_ids  [N] int32      loss_mask [N] uint8      offsets [S+1] int64 (sample i = rows offsets[i]:offsets[i+1])
    aux        [N, k*H] bf16  the target's concatenated aux states
    topk_ids   [N, K] int32   the target's top-K next-token ids over its full vocabulary
    topk_logp  [N, K] f16     their log-probabilities

`index.json` lists the finished shards and is replaced atomically after each one, so a reader sees
only whole shards while capture runs, and a killed capture resumes by skipping them. Reading is
lazy (memory-mapped slices), so a store larger than RAM trains fine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eaglekit.artifacts import check_same_target, manifest_config, read_json, read_manifest
from eaglekit.errors import EaglekitError
from eaglekit.targets.source import validate_safetensors

log = logging.getLogger(__name__)

FORMAT = "eaglekit-features-v1"
INDEX = "index.json"
TENSORS = ("input_ids", "loss_mask", "offsets", "aux", "topk_ids", "topk_logp")


def nonfinite_counts(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Values no feature may hold, by tensor: NaN or Inf in `aux`, NaN or +Inf in `topk_logp` (-Inf is
    a probability of 0, which a float16 log-probability rounds to)."""
    if not maybe_nonfinite(tensors):
        return {}
    counts = {}
    if "aux" in tensors:
        counts["aux"] = int((~torch.isfinite(tensors["aux"])).sum())
    if "topk_logp" in tensors:
        logp = tensors["topk_logp"]
        counts["topk_logp"] = int((torch.isnan(logp) | (logp == float("inf"))).sum())
    return {k: n for k, n in counts.items() if n}


def maybe_nonfinite(tensors: dict[str, torch.Tensor]) -> bool:
    """The quick test behind `nonfinite_counts`: max and min propagate NaN and hold any Inf, and on CPU
    bf16 they cost a few times less than `isfinite` (which counts only once this says yes)."""
    aux, logp = tensors.get("aux"), tensors.get("topk_logp")
    if aux is not None and aux.numel() and not (torch.isfinite(aux.amax()) and torch.isfinite(aux.amin())):
        return True
    if logp is not None and logp.numel():
        top = logp.amax()
        return bool(torch.isnan(top) or top == float("inf"))
    return False


def describe_nonfinite(counts: dict[str, int]) -> str:
    return " and ".join(
        f"{n:,} NaN/Inf {'aux values' if k == 'aux' else 'teacher log-probabilities'}" for k, n in counts.items()
    )


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.safetensors"


def read_index(folder: Path) -> dict:
    path = folder / INDEX
    if not path.is_file():
        return {"format": FORMAT, "shards": []}
    index = read_json(path, what="feature index")
    if index.get("format") != FORMAT:
        raise EaglekitError(
            f"{path} has format {index.get('format')!r}, expected {FORMAT!r}",
            hint="recapture the features with this eaglekit version",
        )
    return index


@dataclass
class ShardRef:
    file: Path
    ids: list[str]
    lengths: list[int]


class FeatureStore:
    """Read an offline feature folder, refusing what does not fit the target.

    Args:
        folder: the output folder of `eaglekit features`.
        target_fingerprint: the target being trained for; a store made for another target or
            tokenizer is refused.
        hidden_size: the target's hidden size; the stored aux width must be num_aux * hidden_size.
        allow_partial: read the finished shards of a capture that is still running (or was killed).

    Raises:
        EaglekitError: not a features folder, another target, a wrong width, an unfinished capture
            (without allow_partial), no samples, or a truncated/corrupt shard; when a sample is read:
            NaN/Inf in its aux states or teacher (`nonfinite_counts`).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        target_fingerprint: dict | None = None,
        hidden_size: int | None = None,
        allow_partial: bool = False,
    ):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder, stage="features")
        if target_fingerprint is not None:
            check_same_target(target_fingerprint, self.manifest.get("target"), what=f"features in {self.folder}")
        aux_layer_ids, topk, width = manifest_config(
            self.manifest, self.folder, "aux_layer_ids", "teacher_topk", "hidden_size"
        )
        self.aux_layer_ids: list[int] = list(aux_layer_ids)
        self.topk: int = int(topk)
        self.hidden_size: int = int(width)
        if hidden_size is not None and hidden_size != self.hidden_size:
            raise EaglekitError(
                f"features in {self.folder} hold {self.hidden_size}-wide states, the target's "
                f"hidden size is {hidden_size}",
                hint="capture features with this target",
            )
        self.complete = bool(self.manifest.get("complete", False))
        index = read_index(self.folder)
        if not self.complete and not allow_partial:
            raise EaglekitError(
                f"feature capture in {self.folder} is not finished ({len(index['shards'])} shards so far)",
                hint="rerun `eaglekit features` with the same arguments to finish it, or pass "
                "--allow-partial-features to train on the finished shards",
            )
        self.shards: list[ShardRef] = []
        self.samples: list[tuple[int, int]] = []  # (shard, row in shard)
        self._held_out: set[str] = set()
        width = len(self.aux_layer_ids) * self.hidden_size
        for entry in index["shards"]:
            file = self.folder / entry["file"]
            if not file.is_file():
                raise EaglekitError(
                    f"shard {file} is listed in the index but missing",
                    hint="the folder is incomplete; rerun `eaglekit features` to recapture it",
                )
            header = validate_safetensors(file)
            self.check_header(file, header, width, entry)
            self.shards.append(ShardRef(file, list(entry["ids"]), list(entry["lengths"])))
            self._held_out.update(entry.get("held_out", ()))
            self.samples += [(len(self.shards) - 1, r) for r in range(len(entry["ids"]))]
        if not self.samples:
            raise EaglekitError(f"features in {self.folder} hold no samples", hint="the dataset is empty")
        counts = self.manifest.get("counts") or {}
        if self.complete and (len(self.shards), len(self.samples)) != (counts.get("shards"), counts.get("samples")):
            raise EaglekitError(
                f"features in {self.folder} index {len(self.shards)} shards and {len(self.samples)} "
                f"samples, the finished capture counted {counts.get('shards')} and {counts.get('samples')}",
                hint="the index was changed after the capture; recapture (`eaglekit features --overwrite`)",
            )
        self._handles: dict[int, object] = {}

    def check_header(self, file: Path, header: dict, width: int, entry: dict) -> None:
        missing = [t for t in TENSORS if t not in header]
        if missing:
            raise EaglekitError(f"shard {file} lacks tensors {missing}", hint="the shard is corrupt; recapture")
        aux_shape = header["aux"]["shape"]
        if aux_shape[-1] != width:
            raise EaglekitError(
                f"shard {file} holds aux states {aux_shape[-1]} wide, expected "
                f"{len(self.aux_layer_ids)} aux layers x {self.hidden_size} = {width}",
                hint="the shard was not made with this store's settings; recapture",
            )
        if aux_shape[0] != sum(entry["lengths"]) or header["offsets"]["shape"][0] != len(entry["ids"]) + 1:
            raise EaglekitError(f"shard {file} does not match its index entry", hint="recapture the features")

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def lengths(self) -> list[int]:
        return [self.shards[s].lengths[r] for s, r in self.samples]

    @property
    def ids(self) -> list[str]:
        return [self.shards[s].ids[r] for s, r in self.samples]

    @property
    def held_out(self) -> set[str]:
        """Ids labelled `split: validation` upstream (none in a store captured before the label was kept)."""
        return set(self._held_out)

    def _open(self, shard: int):
        handle = self._handles.get(shard)
        if handle is None:
            handle = safe_open(str(self.shards[shard].file), framework="pt")
            self._handles[shard] = handle
        return handle

    def sample(
        self,
        i: int,
        names: tuple[str, ...] = ("input_ids", "loss_mask", "aux", "topk_ids", "topk_logp"),
    ) -> dict[str, torch.Tensor]:
        """Tensors of sample i (CPU; rows of its shard, read lazily)."""
        shard, row = self.samples[i]
        f = self._open(shard)
        offsets = f.get_slice("offsets")[row : row + 2]
        a, b = int(offsets[0]), int(offsets[1])
        out = {name: f.get_slice(name)[a:b] for name in names}
        bad = nonfinite_counts(out)  # checked as it is read: a NaN trains a NaN draft without a word
        if bad:
            raise EaglekitError(
                f"features in {self.folder}: sample {self.shards[shard].ids[row]!r} "
                f"({self.shards[shard].file.name}) holds {describe_nonfinite(bad)}",
                hint="the shard was changed after capture, or captured before eaglekit refused "
                "non-finite states: recapture (`eaglekit features ... --overwrite`)",
            )
        if "input_ids" in out:
            out["input_ids"] = out["input_ids"].long()
        if "loss_mask" in out:
            out["loss_mask"] = out["loss_mask"].bool()
        return out

    def token_masks(self):
        """Yield (input_ids, loss_mask) of every sample (for counting the draft vocab)."""
        for shard in range(len(self.shards)):
            f = self._open(shard)
            ids, mask, offsets = f.get_tensor("input_ids"), f.get_tensor("loss_mask"), f.get_tensor("offsets")
            for r in range(len(offsets) - 1):
                a, b = int(offsets[r]), int(offsets[r + 1])
                yield ids[a:b].long(), mask[a:b].bool()
