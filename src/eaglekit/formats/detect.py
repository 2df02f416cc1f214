"""Recognise a draft folder's format and read it as its producer meant it.

Formats: `native` (eaglekit's checkpoint) and every format of the registry (`registry.py`: SGLang's,
also SpecForge's and ModelOpt's; vLLM's speculators layout; EAGLE's traineagle3). Aux layer ids come
back in eaglekit's convention, converted from the convention of the field they were found in
(docs/serving-formats.md §1):

- an `eaglekit` block: eaglekit's own convention, authoritative;
- a format's aux id field, read in that format's convention: the folder's own format's field
  first, else the first in registry order (SGLang's nested `eagle_config` ids: output of layer k;
  vLLM's top-level ids: input of layer k = output of k-1);
- none: the engines' common default, outputs of layers 1, N//2-1, N-4.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import torch

from eaglekit.draft.config import DraftConfig
from eaglekit.errors import EaglekitError
from eaglekit.formats.folder import DraftFolder
from eaglekit.formats.names import EMBED, NATIVE_TENSORS, is_layout_tensor, layer_style, native_name, read_layout
from eaglekit.formats.registry import FORMATS
from eaglekit.targets.aux import default_aux_layer_ids

NATIVE_LABEL = "eaglekit native checkpoint"
FORMAT_LABELS = {"native": NATIVE_LABEL, **{f.name: f.label for f in FORMATS.values()}}
DEFAULT_IDS = "engine defaults (no ids in the config)"


def detect_format(config: dict) -> str:
    """Which format a config.json is written in: a layout that names its format, then the eaglekit
    block eaglekit writes into every config, then each format's own marks in registry order."""
    for fmt in FORMATS.values():
        if fmt.by_layout and fmt.recognises(config):
            return fmt.name
    block = config.get("eaglekit")
    if isinstance(block, dict):
        return block.get("format", "native")
    return next(fmt.name for fmt in FORMATS.values() if fmt.recognises(config))


def flat_config(config: dict, fmt: str) -> dict:
    """The flat Llama-style config of the draft (for speculators: its layer config + EAGLE-3 fields)."""
    return FORMATS[fmt].flat_config(config) if fmt in FORMATS else dict(config)


def rope_parameters(flat: dict) -> dict:
    """Rope settings as a transformers-5 `rope_parameters` dict, from either spelling."""
    if isinstance(flat.get("rope_parameters"), dict) and flat["rope_parameters"]:
        rope = dict(flat["rope_parameters"])
    else:
        rope = dict(flat.get("rope_scaling") or {})
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope["rope_theta"] = float(flat.get("rope_theta") or 10000.0)
    rope.setdefault("rope_type", "default")
    return rope


def declared_aux_ids(flat: dict, fmt: str, num_layers: int | None) -> tuple[list[int], str, list[str]]:
    """Aux ids (eaglekit convention) the config's own fields declare, where from, and conflicts."""
    found = [(f, list(ids)) for f in FORMATS.values() if (ids := f.aux_field_ids(flat))]
    conflicts = [
        f"{b.aux_ids_name} {b_ids} ({b.title} convention) and {a.aux_ids_name} {a_ids} "
        f"({a.title} convention) name different layers"
        for (a, a_ids), (b, b_ids) in combinations(found, 2)
        if a.eaglekit_ids(a_ids) != b.eaglekit_ids(b_ids)
    ]
    if found:
        own, ids = next(((f, ids) for f, ids in found if f.name == fmt), found[0])
        return own.eaglekit_ids(ids), own.aux_source, conflicts
    if num_layers is None:
        raise EaglekitError(
            "the draft's config names no aux layers and the target's layer count is unknown",
            hint="pass --target so the engines' default layers can be worked out",
        )
    return default_aux_layer_ids(num_layers), DEFAULT_IDS, conflicts


@dataclass
class Interpretation:
    """A draft folder read as its producer meant it."""

    folder: DraftFolder
    format: str
    flat: dict
    config: DraftConfig
    aux_source: str
    native: dict[str, torch.Tensor]  # tensors under native names
    embed: torch.Tensor | None  # a shipped copy of the embedding, if any
    unknown: list[str]  # names with no native equivalent
    layer_style: str | None  # "midlayer.", "layers.0.", "mixed" or None
    notes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return FORMAT_LABELS.get(self.format, self.format)


def _int(flat: dict, key: str, fallback=None) -> int:
    value = flat.get(key)
    if value is None:  # null means the default (speculators writes target_hidden_size: null, vLLM reads hidden_size)
        value = fallback
    if value is None:
        raise EaglekitError(f"draft config lacks {key}", hint="the config is incomplete")
    return int(value)


def interpret(folder: DraftFolder, *, target_num_layers: int | None = None) -> Interpretation:
    """Read a folder's config and tensors into native names and a `DraftConfig`.

    Args:
        folder: the raw folder.
        target_num_layers: the target's layer count, needed only when the config names no aux layers.
    """
    fmt = detect_format(folder.config)
    flat = flat_config(folder.config, fmt)
    block = folder.eaglekit or {}
    num_layers = block.get("target_num_layers") or target_num_layers
    notes: list[str] = []

    native: dict[str, torch.Tensor] = {}
    unknown, embed = [], None
    for name, tensor in folder.tensors.items():
        nat, _ = native_name(name)
        if nat == EMBED:
            embed = tensor
        elif (nat in NATIVE_TENSORS or is_layout_tensor(nat)) and nat not in native:
            native[nat] = tensor
        else:
            unknown.append(name)

    ids, source, conflicts = declared_aux_ids(flat, fmt, num_layers)
    if "aux_layer_ids" in block:
        if list(block["aux_layer_ids"]) != ids and source != DEFAULT_IDS:
            conflicts.append(f"the eaglekit block says aux layers {block['aux_layer_ids']}, the {source} say {ids}")
        ids, source = list(block["aux_layer_ids"]), "eaglekit block (output of layer k)"

    hidden = _int(flat, "hidden_size")
    heads = _int(flat, "num_attention_heads")
    draft_vocab = flat.get("draft_vocab_size")
    arch = next(iter(flat.get("architectures") or []), "")
    if (
        draft_vocab is None
        and arch.endswith("ForCausalLM")
        and "eagle" not in arch.lower()
        and _int(flat, "num_hidden_layers", 1) > 1
    ):  # EAGLE's own drafts say LlamaForCausalLM with one layer
        raise EaglekitError(
            f"this folder holds a target model ({arch}, {flat['num_hidden_layers']} layers), not a draft",
            hint="pass the draft folder (an `eaglekit train` or export folder) as the draft, and this "
            "model as --target",
        )
    if draft_vocab is None:
        if "lm_head.weight" not in native:
            raise EaglekitError(
                "draft config lacks draft_vocab_size and the folder has no lm_head", hint="the draft is incomplete"
            )
        draft_vocab = native["lm_head.weight"].shape[0]
        notes.append(f"draft_vocab_size absent; {draft_vocab} taken from lm_head")
    vocab = flat.get("vocab_size") or (native["t2d"].shape[0] if "t2d" in native else None)
    if vocab is None:
        raise EaglekitError("draft config lacks vocab_size", hint="the config is incomplete")
    config = DraftConfig(
        hidden_size=hidden,
        intermediate_size=_int(flat, "intermediate_size"),
        num_attention_heads=heads,
        num_key_value_heads=_int(flat, "num_key_value_heads", heads),
        head_dim=_int(flat, "head_dim", hidden // heads),
        vocab_size=int(vocab),
        draft_vocab_size=int(draft_vocab),
        target_hidden_size=_int(flat, "target_hidden_size", hidden),
        aux_layer_ids=tuple(ids),
        rms_norm_eps=float(flat.get("rms_norm_eps") or 1e-6),
        max_position_embeddings=_int(flat, "max_position_embeddings", 4096),
        rope_parameters=rope_parameters(flat),
        hidden_act=flat.get("hidden_act") or "silu",
        norm_before_residual=bool(flat.get("norm_before_residual", False)),
        **read_layout(flat),
        target_num_layers=num_layers,
    )
    return Interpretation(
        folder=folder,
        format=fmt,
        flat=flat,
        config=config,
        aux_source=source,
        native=native,
        embed=embed,
        unknown=sorted(unknown),
        layer_style=layer_style(folder.tensors),
        notes=notes,
        conflicts=conflicts,
    )
