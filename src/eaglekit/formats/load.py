"""A draft folder of any format made runnable: read and checked before any model loads, converted in
memory as `eaglekit import` converts it, in the target's dtype with its embedding. Used by `bench`,
`speculate` and training's checks; `random_draft_for` gives the real draft cost with no acceptance."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from eaglekit.artifacts import check_same_target, refuse_unfinished
from eaglekit.draft import DraftConfig, Eagle3Draft
from eaglekit.draft.checkpoint import check_finite
from eaglekit.draft.config import DRAFT_VOCAB_SIZE
from eaglekit.errors import EaglekitError
from eaglekit.formats.folder import DraftFolder, read_folder
from eaglekit.formats.importer import check_fits_target, native_tensors, strict_reading
from eaglekit.targets.aux import default_aux_layer_ids
from eaglekit.targets.load import text_config

log = logging.getLogger(__name__)


def read_draft_folder(
    folder: str | Path, *, allow_unfinished: bool = False, stand_ins: tuple[str, ...] = ("oracle", "random")
) -> DraftFolder:
    """A draft folder of any format the doctor reads (eaglekit, SGLang / SpecForge, speculators, EAGLE),
    read before any model loads, so a wrong path, an unfinished draft or NaN/Inf weights fail in a second.
    `stand_ins`: the names the calling command takes in place of a folder (for the hint)."""
    folder = Path(folder)
    if not folder.is_dir():
        names = " or ".join(f"`{name}`" for name in stand_ins)
        raise EaglekitError(
            f"no draft folder {folder}", hint="pass a draft folder" + (f", or {names}" if names else "")
        )
    draft = read_folder(folder)
    refuse_unfinished(draft.unfinished, folder, allow_unfinished=allow_unfinished)
    check_finite(draft.tensors, folder)  # NaN/Inf weights too, before any model loads
    return draft


def load_draft_for(folder: str | Path | DraftFolder, target, device: str, *, allow_unfinished: bool = False):
    """A draft of any format, converted in memory as `eaglekit import` converts it, refused if it was
    made for another target; in the target's dtype, with the target's embedding."""
    if not isinstance(folder, DraftFolder):
        folder = read_draft_folder(folder, allow_unfinished=allow_unfinished, stand_ins=())
    if folder.recorded_target is not None:
        check_same_target(target.fingerprint(), folder.recorded_target, what=f"draft {folder.path}")
    reading = strict_reading(folder, target_num_layers=target.config.num_hidden_layers)
    check_fits_target(reading.config, target.config, folder.path)
    if reading.format != "native":
        log.info("draft %s: %s, converted in memory", folder.path, reading.label)
    draft = Eagle3Draft(reading.config)
    draft.load_state_dict(native_tensors(reading), strict=False)  # strict_reading checked names and shapes
    dtype = next(target.model.parameters()).dtype
    draft.set_target_embedding(target.model.get_input_embeddings().weight)
    return draft.to(device=device, dtype=dtype).eval()


def random_draft_for(model, device: str):
    """A randomly initialized draft for an HF target model: real draft cost, no acceptance."""
    cfg = text_config(model.config)
    config = DraftConfig.for_target(
        cfg,
        aux_layer_ids=default_aux_layer_ids(cfg.num_hidden_layers),
        draft_vocab_size=min(cfg.vocab_size, DRAFT_VOCAB_SIZE),
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(config)
    draft.set_target_embedding(model.get_input_embeddings().weight)
    return draft.to(device=device, dtype=next(model.parameters()).dtype).eval()
