"""`eaglekit import`: read a draft folder of any known format into eaglekit's native checkpoint.

Tensors keep their dtype and bits (only names change); the config becomes a `DraftConfig` with aux
layer ids converted from the convention of the field they were read from (`detect.py`). The result
is reloaded with `load_draft` and compared bit for bit before the command reports success.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglekit.artifacts import atomic_dir, atomic_path, check_same_target, sha256_file, write_json, write_manifest
from eaglekit.draft import Eagle3Draft
from eaglekit.draft.checkpoint import CONFIG, WEIGHTS, check_finite, load_draft
from eaglekit.draft.vocab import d2t_problems
from eaglekit.errors import EaglekitError
from eaglekit.formats.detect import Interpretation, interpret
from eaglekit.formats.facts import TargetFacts, target_facts
from eaglekit.formats.folder import DraftFolder, read_folder
from eaglekit.formats.names import VOCAB_MAPS
from eaglekit.targets.aux import check_aux_layer_ids

log = logging.getLogger(__name__)


def read_strict(path: str | Path, facts: TargetFacts | None) -> Interpretation:
    """Read a draft folder and refuse anything that would not convert faithfully (`strict_reading`)."""
    return strict_reading(read_folder(path), target_num_layers=facts.num_layers if facts else None)


def strict_reading(folder: DraftFolder, *, target_num_layers: int | None) -> Interpretation:
    """A draft folder of any format read into native names, refusing anything that would not convert faithfully.

    Raises:
        EaglekitError: unknown tensor names, missing tensors, or config fields that contradict
            each other (the doctor explains each of these in detail).
    """
    path = folder.path
    check_finite(folder.tensors, path)  # NaN/Inf weights run without an error and are never accepted
    reading = interpret(folder, target_num_layers=target_num_layers)
    problems = list(reading.conflicts)
    if reading.unknown:
        problems.append(f"tensors with no EAGLE-3 meaning {reading.unknown[:6]}")
    with torch.device("meta"):  # shapes only, no memory
        expected = Eagle3Draft(reading.config).draft_state_dict()  # the native tensors, in the config's layout
    missing = [n for n in expected if n not in reading.native and n not in VOCAB_MAPS]
    if missing:
        problems.append(f"missing tensors {missing[:6]}")
    unused = [name for name in reading.native if name not in expected]
    if unused:
        problems.append(f"tensors {unused[:6]} that the config's layout does not use (norm_before_fc / fc_norm)")
    problems += [
        f"{name} is {tuple(t.shape)}, the config implies {tuple(expected[name].shape)}"
        for name, t in reading.native.items()
        if name in expected and tuple(t.shape) != tuple(expected[name].shape)
    ]
    if problems:
        raise EaglekitError(
            f"{path} cannot be read faithfully: " + "; ".join(problems),
            hint=f"run `eaglekit doctor {path} --target T` to see what is wrong",
        )
    return reading


def stamp_target(reading: Interpretation, facts: TargetFacts | None, path: str | Path) -> dict | None:
    """The target an output names: the one the folder records, checked against `facts`. A folder
    that records none must fit the target (vocab, hidden width, aux layers) before it is stamped
    with it: one made for another target was once stamped and exported without a word."""
    recorded = reading.folder.recorded_target
    if facts is None:
        return recorded
    if recorded:
        check_same_target(facts.fingerprint, recorded, what=f"draft {path}")
    else:
        check_fits_target(reading.config, facts.config, Path(path))
        check_aux_layer_ids(list(reading.config.aux_layer_ids), facts.num_layers)
    return facts.fingerprint


def native_tensors(reading: Interpretation) -> dict[str, torch.Tensor]:
    """The native tensors, with the identity vocab maps filled in where a format leaves them out."""
    cfg, native = reading.config, dict(reading.native)
    if "d2t" in native:  # absolute ids or out-of-vocab offsets passed the reload check, then broke decoding
        problems, fix = d2t_problems(native["d2t"], None, cfg.draft_vocab_size, cfg.vocab_size)  # t2d: the doctor's
        if problems:
            raise EaglekitError(f"{reading.folder.path}: " + "; ".join(problems), hint=fix)
    if "d2t" not in native:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise EaglekitError(
                f"the draft vocab ({cfg.draft_vocab_size}) is smaller than the target's "
                f"({cfg.vocab_size}) but the folder has no d2t",
                hint="without d2t the engines map draft ids to the wrong tokens",
            )
        # Equal vocabularies: the engines use the identity map (offsets 0), so this is exact.
        native["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    if "t2d" not in native:  # ModelOpt and EAGLE (equal vocabularies) write none: it follows from d2t
        targets = torch.arange(cfg.draft_vocab_size) + native["d2t"].long()
        if not bool(((targets >= 0) & (targets < cfg.vocab_size)).all()):
            raise EaglekitError(
                "d2t maps draft ids outside the target vocab, so t2d cannot be derived",
                hint="run `eaglekit doctor` on the folder: d2t may hold absolute ids",
            )
        native["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        native["t2d"][targets] = True
    return native


def import_draft(
    path: str | Path,
    out: str | Path,
    *,
    target: str | None = None,
    aux_layer_ids: list[int] | None = None,
    overwrite: bool = False,
) -> dict:
    """Convert a SGLang / EAGLE / ModelOpt / speculators draft folder into a native checkpoint.

    Args:
        path: the draft folder.
        out: the native checkpoint folder to write.
        target: the target it was made for: refuses a draft recorded for another target, and gives
            the layer count when the config names no aux layers.
        aux_layer_ids: override the aux layer ids (eaglekit convention: output of 0-based layer i)
            when the folder's own are known to be wrong.

    Returns:
        The manifest written to `out/manifest.json`.
    """
    facts = target_facts(target) if target else None
    reading = read_strict(path, facts)
    cfg = reading.config
    if aux_layer_ids is not None:
        cfg = replace(cfg, aux_layer_ids=tuple(aux_layer_ids))
    if cfg.target_num_layers is None and facts is not None:
        cfg = replace(cfg, target_num_layers=facts.num_layers)
    if cfg.target_num_layers is not None:
        check_aux_layer_ids(list(cfg.aux_layer_ids), cfg.target_num_layers)
    fingerprint = stamp_target(reading, facts, path)
    tensors = {k: v.contiguous() for k, v in native_tensors(reading).items()}

    with atomic_dir(out, overwrite=overwrite, stage="import") as tmp:
        with atomic_path(tmp / WEIGHTS) as file:
            save_file(tensors, str(file), metadata={"format": "pt"})
        write_json(tmp / CONFIG, cfg.to_hf_dict())
        check_native(tmp, tensors)
        manifest = write_manifest(
            tmp,
            stage="import",
            config={
                "source": str(path),
                "format": reading.format,
                "aux_source": reading.aux_source,
                "aux_layer_ids": list(cfg.aux_layer_ids),
            },
            target=fingerprint,
            inputs={
                "draft": {
                    "path": str(path),
                    "sha256": {f.name: sha256_file(f) for f in sorted(Path(path).glob("*.safetensors"))},
                }
            },
            counts={"tensors": len(tensors)},
            extra={
                "notes": reading.notes,
                "source_manifest": reading.folder.manifest,
                "unfinished_draft": reading.folder.unfinished,
            },
        )
    log.info("imported %s (%s) -> %s", path, reading.label, out)
    return manifest


def check_native(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Load the written checkpoint the way every stage will, and compare it bit for bit."""
    draft = load_draft(folder, dtype=torch.float32)  # validates names and shapes against the config
    state = draft.draft_state_dict()
    for name, tensor in tensors.items():
        if not torch.equal(state[name].to(tensor.dtype), tensor):
            raise EaglekitError(
                f"{name} does not read back bit-identical from {folder}",
                hint="this is a bug in eaglekit; please report it",
            )


def check_fits_target(cfg, target_cfg, path: Path) -> None:
    """A draft without a recorded target must at least have the target's vocab and hidden width."""
    for name, mine, theirs in (
        ("vocab_size", cfg.vocab_size, target_cfg.vocab_size),
        ("target_hidden_size", cfg.target_hidden_size, target_cfg.hidden_size),
    ):
        if mine != theirs:
            raise EaglekitError(
                f"draft {path} has {name} {mine}, the target {theirs}: it was made for another target",
                hint=f"run `eaglekit doctor {path} --target T` to see what it was made for",
            )
