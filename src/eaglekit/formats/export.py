"""`eaglekit export`: write a draft for SGLang, vLLM or EAGLE, then prove the output reads back.

The output is written into a temporary folder beside `out`, reloaded and compared with what was
meant (tensor names, shapes and bits in the exported dtype; the config read back through the same
importer users run), and only then moved into place. A failed check leaves no output folder.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglekit.artifacts import atomic_dir, atomic_path, refuse_unfinished, sha256_file, write_json, write_manifest
from eaglekit.draft.checkpoint import CONFIG, WEIGHTS, check_finite
from eaglekit.draft.config import DraftConfig
from eaglekit.errors import EaglekitError
from eaglekit.formats.detect import interpret
from eaglekit.formats.facts import target_facts
from eaglekit.formats.folder import read_folder
from eaglekit.formats.importer import native_tensors, read_strict, stamp_target
from eaglekit.formats.options import ExportOptions
from eaglekit.formats.registry import check_format
from eaglekit.targets.load import DTYPES

log = logging.getLogger(__name__)


def cast(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floats to `dtype`; d2t stays int64 offsets and t2d stays bool."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}


def verify_export(folder: Path, fmt: str, expected: dict[str, torch.Tensor], cfg: DraftConfig) -> None:
    """Reload an export and compare names, dtypes, bits and the config read back with what was meant."""
    reading = interpret(read_folder(folder), target_num_layers=cfg.target_num_layers)
    on_disk = reading.folder.tensors
    problems = []
    if reading.format != fmt:
        problems.append(f"reads back as format {reading.format!r}")
    if set(on_disk) != set(expected):
        problems.append(
            f"tensor names differ: missing {sorted(set(expected) - set(on_disk))[:4]}, "
            f"extra {sorted(set(on_disk) - set(expected))[:4]}"
        )
    for name, tensor in expected.items():
        got = on_disk.get(name)
        if got is not None and (got.dtype != tensor.dtype or got.shape != tensor.shape or not torch.equal(got, tensor)):
            problems.append(f"{name} reads back as {got.dtype} {tuple(got.shape)}, not the bits written")
    if reading.unknown or reading.conflicts:
        problems.append(f"unknown names {reading.unknown[:4]} / conflicts {reading.conflicts}")
    if reading.config != cfg:
        diff = {
            k: (getattr(reading.config, k), getattr(cfg, k))
            for k in cfg.to_dict()
            if getattr(reading.config, k) != getattr(cfg, k)
        }
        problems.append(f"config reads back differently: {diff}")
    if problems:
        raise EaglekitError(
            f"the {fmt} export in {folder} failed its reload check: " + "; ".join(problems),
            hint="this is a bug in eaglekit; please report it with the checkpoint's config.json",
        )


def export_draft(
    ckpt: str | Path,
    fmt: str,
    out: str | Path,
    *,
    target: str | None = None,
    dtype: str = ExportOptions.dtype,
    speculative_tokens: int = ExportOptions.speculative_tokens,
    overwrite: bool = False,
    allow_unfinished: bool = False,
) -> dict:
    """Export a draft checkpoint for an engine and verify it before reporting success.

    Args:
        ckpt: eaglekit's native checkpoint (or any draft folder `eaglekit import` reads).
        fmt: "sglang", "vllm" or "eagle".
        out: the output folder (refused if it exists, unless `overwrite`).
        target: the target (path or `smollm2`): checks the draft was made for it, and names it as
            the verifier in the vLLM config.
        dtype: dtype of the exported float weights (default bfloat16).
        speculative_tokens: draft tokens per step written into the vLLM config.
        allow_unfinished: export a draft whose training did not finish (refused otherwise); the
            export's manifest and config then record why it is unfinished.

    Returns:
        The manifest written to `out/manifest.json`.
    """
    form = check_format(fmt)
    if dtype not in DTYPES:
        raise EaglekitError(f"unknown dtype {dtype!r}", hint=f"use one of {sorted(DTYPES)}")
    facts = target_facts(target) if target else None
    reading = read_strict(ckpt, facts)
    source_manifest = reading.folder.manifest or {}
    unfinished = refuse_unfinished(reading.folder.unfinished, ckpt, allow_unfinished=allow_unfinished)
    fingerprint = stamp_target(reading, facts, ckpt)
    cfg = reading.config
    if cfg.target_num_layers is None and facts:
        cfg = replace(cfg, target_num_layers=facts.num_layers)

    native = native_tensors(reading)
    casted = cast(native, DTYPES[dtype])
    try:  # the draft was read finite: what is not finite now overflowed the export's dtype (float16's 65,504)
        check_finite(casted, ckpt)
    except EaglekitError as err:
        raise EaglekitError(
            f"{err.message} once cast to {dtype}: its values overflow {dtype}",
            hint="export in bfloat16 or float32 (--dtype bfloat16)",
        ) from None
    tensors = form.to_format(casted, same_vocab=cfg.draft_vocab_size == cfg.vocab_size)
    marks = {"unfinished": unfinished} if unfinished else {}  # travels with the config to any engine's folder
    config = form.write_config(
        cfg, facts=facts, speculative_tokens=speculative_tokens, extra={"target": fingerprint, **marks}
    )

    with atomic_dir(out, overwrite=overwrite, stage="export") as tmp:
        with atomic_path(tmp / WEIGHTS) as path:
            save_file(tensors, str(path), metadata={"format": "pt"})
        write_json(tmp / CONFIG, config)
        verify_export(tmp, fmt, tensors, cfg)
        manifest = write_manifest(
            tmp,
            stage="export",
            config={"format": fmt, "dtype": dtype, "speculative_tokens": speculative_tokens, "source": str(ckpt)},
            target=fingerprint,
            inputs={
                "checkpoint": {
                    "path": str(ckpt),
                    "format": reading.format,
                    "sha256": {f.name: sha256_file(f) for f in sorted(Path(ckpt).glob("*.safetensors"))},
                }
            },
            counts={
                "tensors": len(tensors),
                "parameters": sum(t.numel() for t in tensors.values() if t.is_floating_point()),
            },
            extra={
                "aux_layer_ids": {"eaglekit": list(cfg.aux_layer_ids), "written": form.engine_ids(cfg.aux_layer_ids)},
                "source_manifest": source_manifest or None,
                "unfinished_draft": unfinished,
            },
        )
    log.info("exported %s -> %s (%s, %s)", ckpt, out, fmt, dtype)
    return manifest
