"""`--cache-target`: online training keeps what the loss needs from the target in host memory on the
first pass over its data, so that later passes read it back instead of running the target again.

Kept per conversation, for its real tokens only (batch rows are right-padded), in the target's dtype:
    aux   [T_i, A*H]  the concatenated aux states (A aux layers, H the target's hidden size)
    last  [T_i, H]    the target's final hidden state: the teacher is rebuilt from it as
                      dense_teacher(lm_head(last), draft_ids), V/H times smaller than its logits
so a token costs (A + 1) x H x itemsize bytes. Each kind is one arena sized by the sum of the
source's lengths, allocated up front; a sample's rows sit at its offset.
"""

from __future__ import annotations

import itertools
import logging
import weakref

import torch

from eaglekit.errors import EaglekitError
from eaglekit.targets.load import text_config

log = logging.getLogger(__name__)

HOST_SHARE = 0.8  # of the host's available memory the arenas may take; the rest stays the run's own


def check_target_cache_supported(world_size: int) -> None:
    """One process only: under DDP each rank would cache every conversation it ever sees."""
    if world_size > 1:
        raise EaglekitError(
            "--cache-target keeps the target's states in this process's host memory, and under DDP every "
            "rank would hold its own copy of what it sees",
            hint="train in one process, or drop --cache-target",
        )


def available_host_bytes() -> int | None:
    """MemAvailable of /proc/meminfo, in bytes; None where the system has no such file (not Linux)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file says kB
    except OSError:
        return None
    return None


def size_text(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def check_host_memory(needed: int, tokens: int) -> None:
    """Refuse arenas that would take more than HOST_SHARE of the memory the host has available."""
    available = available_host_bytes()
    if available is None:
        log.warning(
            "--cache-target: no MemAvailable in /proc/meminfo; %s of host memory not checked", size_text(needed)
        )
        return
    if needed > HOST_SHARE * available:
        raise EaglekitError(
            f"--cache-target needs {size_text(needed)} of host memory for {tokens:,} tokens, more than "
            f"{HOST_SHARE:.0%} of the {size_text(available)} available",
            hint="train on fewer conversations (--train-fraction), or drop --cache-target",
        )


def page_lock(tensor: torch.Tensor) -> None:
    """Pin a host tensor in place, so the copies to and from the device run asynchronously (`unlock`
    releases it). Not `pin_memory=True`: torch's pinned allocator rounds a block up to a power of
    two, which would lock up to twice the arena."""
    code = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.nbytes, 0))
    if code != 0:
        raise EaglekitError(
            f"could not page-lock {size_text(tensor.nbytes)} of host memory for --cache-target (CUDA error {code})",
            hint="raise the locked-memory limit (ulimit -l), or drop --cache-target",
        )


def unlock(pointers: list[int]) -> None:
    """Undo `page_lock` before the memory is freed: `eaglekit run` may train in its own process and
    go on, and the driver must not keep pages registered that the allocator hands out again."""
    for pointer in pointers:
        torch.cuda.cudart().cudaHostUnregister(pointer)


class TargetCache:
    """Host arenas of one source's target states, filled batch by batch as the target runs.

    Args:
        lengths: each sample's real tokens.
        aux_width: A*H, the concatenated aux states' width.
        hidden_size: H.
        dtype: the target's dtype.
        page_locked: pin the arenas (training on CUDA).
    """

    def __init__(self, lengths: list[int], *, aux_width: int, hidden_size: int, dtype, page_locked: bool):
        self.offsets = [0, *itertools.accumulate(lengths)]  # sample i: rows offsets[i]:offsets[i + 1]
        tokens = self.offsets[-1]
        # Uninitialized: a sample's rows are read only once the target has filled them.
        self.aux = torch.empty(tokens, aux_width, dtype=dtype)  # [N, A*H]
        self.last = torch.empty(tokens, hidden_size, dtype=dtype)  # [N, H]
        self.filled = [False] * len(lengths)
        self.page_locked = page_locked
        if page_locked:
            page_lock(self.aux)
            page_lock(self.last)
            # Runs when the cache is collected, before its arenas are freed.
            weakref.finalize(self, unlock, [self.aux.data_ptr(), self.last.data_ptr()])
        self.copies: list[torch.cuda.Event] = []  # device-to-host copies not yet known to be done
        self.logits_dtype = None  # the dtype of the target's own logits, once checked (`check_head`)
        self.batches_cached = 0
        self.batches_target = 0

    @property
    def tokens(self) -> int:
        return self.offsets[-1]

    @property
    def nbytes(self) -> int:
        return self.aux.nbytes + self.last.nbytes

    def holds(self, indices: list[int]) -> bool:
        return all(self.filled[i] for i in indices)

    def store(self, indices: list[int], aux: torch.Tensor, last: torch.Tensor) -> None:
        """Keep the real rows of a batch the target ran.

        Args:
            indices: the batch's samples, one per row.
            aux: [B, T, A*H] the batch's aux states.
            last: [B, T, H] its final hidden states.
        """
        if aux.dtype != self.aux.dtype or last.dtype != self.last.dtype:
            raise EaglekitError(
                f"the target's states are {aux.dtype}/{last.dtype}, not its weights' {self.aux.dtype}",
                hint="drop --cache-target (it keeps states in the target's dtype, and would round these)",
            )
        for row, i in enumerate(indices):
            if self.filled[i]:
                continue
            start, end = self.offsets[i], self.offsets[i + 1]
            self.aux[start:end].copy_(aux[row, : end - start], non_blocking=self.page_locked)
            self.last[start:end].copy_(last[row, : end - start], non_blocking=self.page_locked)
            self.filled[i] = True
        if self.page_locked:  # the states may sit on two devices (a sharded target): one event each
            for device in {aux.device, last.device}:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(device))
                self.copies.append(event)

    def load(self, indices: list[int], length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's states from the arenas, zero-padded to `length` as `pad_stack` pads.

        Returns:
            aux [B, length, A*H] and last [B, length, H], on `device`.
        """
        for event in self.copies:
            event.synchronize()
        self.copies = []
        aux = torch.zeros(len(indices), length, self.aux.shape[1], dtype=self.aux.dtype, device=device)
        last = torch.zeros(len(indices), length, self.last.shape[1], dtype=self.last.dtype, device=device)
        for row, i in enumerate(indices):
            start, end = self.offsets[i], self.offsets[i + 1]
            aux[row, : end - start].copy_(self.aux[start:end], non_blocking=self.page_locked)
            last[row, : end - start].copy_(self.last[start:end], non_blocking=self.page_locked)
        return aux, last

    def check_head(self, head: torch.nn.Module, logits: torch.Tensor, last: torch.Tensor) -> None:
        """Refuse a target whose logits are not its output head applied to its final hidden state (a
        final logit soft-cap, a logit scale): the teacher rebuilt from the cache would be another.

        Compared exactly, not within a tolerance: the head applied to the very tensor the model gave
        it is the same computation, so any difference is the model doing something else, and one of
        rounding alone would still train the cached passes on another teacher than the first.

        Args:
            head: the target's `get_output_embeddings()`.
            logits: [B, T, V] the model's own logits.
            last: [B, T, H] its final hidden state, from the same forward.
        """
        rebuilt = head(last.to(head.weight.device)).to(logits.dtype)  # [B, T, V]
        if not torch.equal(rebuilt, logits.to(rebuilt.device)):
            diff = (rebuilt.float() - logits.float().to(rebuilt.device)).abs().max().item()
            same_argmax = torch.equal(rebuilt.argmax(-1), logits.argmax(-1).to(rebuilt.device))
            raise EaglekitError(
                f"--cache-target rebuilds the teacher as lm_head(final hidden state), and this target's logits "
                f"are something else (max difference {diff:.3g}, argmax {'equal' if same_argmax else 'differs'}): "
                "a final logit soft-cap or a logit scale",
                hint="drop --cache-target for this target",
            )
        self.logits_dtype = logits.dtype


def attach_target_caches(sources, *, page_locked: bool) -> list[TargetCache]:
    """Give each online source (training, validation; None skipped) its cache, after checking that
    all of them fit in host memory together.

    Args:
        sources: `OnlineSource`s or None.
        page_locked: pin the arenas (training on CUDA).
    """
    sources = [s for s in sources if s is not None]
    model = sources[0].model
    hidden = text_config(model.config).hidden_size
    num_aux = len(sources[0].aux_layer_ids)
    per_token = (num_aux + 1) * hidden * model.dtype.itemsize  # aux [A*H] + last [H]
    tokens = sum(sum(s.lengths) for s in sources)
    check_host_memory(tokens * per_token, tokens)
    caches = []
    for source in sources:
        source.cache = TargetCache(
            source.lengths,
            aux_width=num_aux * hidden,
            hidden_size=hidden,
            dtype=model.dtype,
            page_locked=page_locked,
        )
        caches.append(source.cache)
    log.info(
        "--cache-target: %s of host memory for %s tokens (%d bytes a token)%s",
        size_text(tokens * per_token),
        f"{tokens:,}",
        per_token,
        ", page-locked" if page_locked else "",
    )
    return caches


def cache_summary(caches: list[TargetCache]) -> dict:
    """The manifest's `target_cache`: what the arenas hold, and how many batches (training and
    validation) were read from them and how many ran the target, in this process."""
    return {
        "bytes": sum(c.nbytes for c in caches),
        "tokens": sum(c.tokens for c in caches),
        "batches_cached": sum(c.batches_cached for c in caches),
        "batches_target": sum(c.batches_target for c in caches),
    }
