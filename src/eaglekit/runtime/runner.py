"""Choosing the target runner: FAST (lean decoder) or GENERIC (the HF model with an engine cache).

Both implement the same small interface:

    runner(input_ids [B, T], positions [B, T], slots [T], mask [B|1, 1, T, L] bool, last_only=False)
        -> logits [B, T, V] ([B, 1, V] with last_only), aux [B, T, A] or None
    runner.move_kv(src [S], dst [S])            copy cache slots (rollback / compaction)
    runner.max_len, .batch_size, .vocab_size, .aux_layer_ids, .aux_width, .kind

The choice is made up front and logged: `auto` takes FAST when the config is a plain Llama-family
decoder, else GENERIC; asking for `fast` on an unsupported config raises. FAST checks its logits
against the HF model at load and raises on a mismatch (never a silent fallback).
"""

from __future__ import annotations

import logging

from torch import nn

from eaglekit.errors import EaglekitError
from eaglekit.runtime.target_fast import FastTarget, fast_unsupported_reason
from eaglekit.runtime.target_hf import HFTarget

log = logging.getLogger(__name__)
RUNNERS = ("auto", "fast", "generic")


def make_target_runner(
    model: nn.Module,
    *,
    max_len: int,
    batch_size: int = 1,
    aux_layer_ids=(),
    runner: str = "auto",
    attention: str | None = None,
    matvec: bool | None = None,
    small_rows: int | None = None,
    attention_rows: int | None = None,
) -> FastTarget | HFTarget:
    """Build the target runner for an HF causal LM.

    Args:
        model: the loaded HF model (eval mode).
        max_len: cache slots per sequence (prompt + new tokens + one draft tree).
        batch_size: sequences decoded together.
        aux_layer_ids: layers whose outputs the draft reads (eaglekit convention); () for none.
        runner: "auto", "fast" or "generic".
        attention: the FAST runner's attention kernels (`kv.ATTENTION_KINDS`); None = its default.
        matvec: the FAST runner's one-token linears as fusible reductions (`kernels.linear`);
            None = its default.
        small_rows: the FAST runner's most tokens per forward for those forms; None = its default.
        attention_rows: the most tokens per forward for its reduce attention; None = small_rows.
    """
    if runner not in RUNNERS:
        raise EaglekitError(f"unknown runner {runner!r}", hint=f"use one of {RUNNERS}")
    if runner == "auto":
        reason = fast_unsupported_reason(model, max_len)
        runner = "generic" if reason else "fast"
        if reason:
            log.info("target runner: generic (%s)", reason)
    kwargs = dict(max_len=max_len, batch_size=batch_size, aux_layer_ids=aux_layer_ids)
    kernels = {
        name: value
        for name, value in (
            ("attention", attention),
            ("matvec", matvec),
            ("small_rows", small_rows),
            ("attention_rows", attention_rows),
        )
        if value is not None
    }
    if runner == "fast":
        built = FastTarget(model, **kwargs, **kernels)
    elif kernels:
        raise EaglekitError(
            f"{kernels} apply to the fast runner only",
            hint="drop it, or use a Llama-family target with the fast runner",
        )
    else:
        built = HFTarget(model, **kwargs)
    log.info("target runner: %s, %d slots x batch %d", built.kind, max_len, batch_size)
    return built
