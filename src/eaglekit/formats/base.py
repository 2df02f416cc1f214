"""What every format is made of: a `Format` record (one per module: `sglang.py`, `vllm.py`, `eagle.py`),
how its engine reads a draft folder (`EngineReading`), and the pieces those readings share.

A format is its name, the decoder layer's parameter prefix it writes, whether it keeps the vocab maps,
its aux id convention, its config writer and reader, and a model of how its engine loads a draft
(the doctor compares that with what the draft was trained for, and words its findings with the
format's own notes: what the engine does without a field, which of its versions drop a name). The
readers model the engine versions docs/doctor.md lists under "Limits". No torch here: the options
read the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from eaglekit import __version__
from eaglekit.artifacts import AUX_CONVENTION
from eaglekit.formats.names import NATIVE_LAYER, NATIVE_TENSORS, VOCAB_MAPS
from eaglekit.targets.aux import default_aux_layer_ids

if TYPE_CHECKING:  # annotations only
    import torch

    from eaglekit.draft.config import DraftConfig
    from eaglekit.formats.detect import Interpretation

REQUIRED = tuple(n for n in NATIVE_TENSORS if n not in VOCAB_MAPS)
LAYER_PARAMS = tuple(n[len(NATIVE_LAYER) :] for n in NATIVE_TENSORS if n.startswith(NATIVE_LAYER))
DEFAULTS = "the engine's default layers"


@dataclass
class EngineReading:
    """What one engine makes of a draft folder."""

    engine: str
    config: dict  # the flat config the engine builds the draft from
    loads: dict[str, str] = field(default_factory=dict)  # file tensor name -> native name it fills
    dropped: list[str] = field(default_factory=list)  # file names the engine ignores without a word
    refused: list[str] = field(default_factory=list)  # file names that make the engine fail to load
    missing: list[str] = field(default_factory=list)  # native tensors left at their init values
    aux_layer_ids: list[int] | None = None  # eaglekit convention: what the engine captures
    aux_alternative: list[int] | None = None  # what another version of the engine captures
    aux_source: str = ""
    use_aux: bool = True  # False: one final state is fed and fc is skipped
    draft_vocab_size: int | None = None  # as the engine reads it (None: absent)
    norm_before_residual: bool = False
    layout: dict[str, bool] = field(
        default_factory=dict
    )  # the EAGLE-3.1 flags it builds the draft with (`read_layout`)
    embedding: str = "target"  # "target" or "draft": whose embedding it uses
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (status, message, hint)


@dataclass(frozen=True)
class Format:
    """Everything eaglekit knows about one draft format and the engine that serves it."""

    name: str  # `--format` and `--engine`
    title: str  # the engine's name in messages
    label: str  # what a folder of this format is called (import, doctor, bench)
    layer_prefix: str  # the decoder layer's parameter prefix it writes
    keeps_vocab_maps: bool  # whether d2t/t2d are written when draft vocab == target vocab
    aux_offset: int  # its aux id = eaglekit's id + aux_offset
    recognises: Callable[[dict], bool]  # whether a config.json is written in this format
    write_config: Callable[..., dict]  # (cfg, *, facts, speculative_tokens, extra) -> config.json
    engine_reading: Callable[..., EngineReading]  # (interp, target_vocab, target_layers) -> the engine's reading
    flat_config: Callable[[dict], dict] = dict  # the flat Llama-style config inside a config.json
    by_layout: bool = False  # its layout alone names it, before any eaglekit block (vLLM's speculators)
    aux_field: str | None = None  # the config field its aux ids are written in (None: hard-coded layers)
    aux_field_ids: Callable[[dict], list | None] = lambda flat: None  # the ids that field holds in a flat config
    aux_ids_name: str = ""  # that field in a message ("nested ids")
    aux_source: str = ""  # where ids read from that field came from, in eaglekit's words
    speculative_tokens: Callable[[dict], int | None] = lambda config: None  # draft tokens per step its config names
    # What the doctor says of how the engine misreads a folder (doctor/checks.py).
    fc_inputs: Callable[[dict], int] = lambda flat: 3  # aux states the engine sizes fc for, from its flat config
    #   (SGLang's and EAGLE's versions read: always three)
    fc_only_if_widths_differ: bool = False  # fc is skipped when the fused width equals the hidden size
    older_miss_last_layer: bool = False  # older versions cannot capture the last layer's output
    without_draft_vocab_size: str = ""  # what the engine does with a config that has no draft_vocab_size
    without_lm_head: str | None = None  # what it does with a folder that has no lm_head (None: left random)
    drops: Callable[[list[str]], list[str]] | None = None  # dropped names as findings by version (None: all)
    missing_where: Callable[[list[str]], str] = lambda dropped: ""  # the versions that leave missing params random
    rename_layers: str | None = None  # the hint for a folder with another format's layer prefix (None: it loads it)
    holds_layout: bool = True  # whether its engine runs EAGLE-3.1's norms (`DraftConfig.layout`)

    def engine_ids(self, aux_layer_ids) -> list[int]:
        """eaglekit's aux ids (output of layer i) as this format's config holds them."""
        return [i + self.aux_offset for i in aux_layer_ids]

    def eaglekit_ids(self, ids) -> list[int]:
        """This format's aux ids in eaglekit's convention."""
        return [i - self.aux_offset for i in ids]

    def to_format(self, native: dict[str, torch.Tensor], *, same_vocab: bool) -> dict[str, torch.Tensor]:
        """Rename native tensors to this format's names (and drop the vocab maps where it has none)."""
        out = {}
        for name, tensor in native.items():
            if name in VOCAB_MAPS and same_vocab and not self.keeps_vocab_maps:
                continue
            out[self.layer_prefix + name[len(NATIVE_LAYER) :] if name.startswith(NATIVE_LAYER) else name] = tensor
        return out

    def read(self, interp: Interpretation, *, target_vocab: int | None, target_layers: int | None) -> EngineReading:
        """Model how this format's engine reads the folder behind `interp`."""
        reading = self.engine_reading(interp, target_vocab, target_layers)
        if reading.aux_layer_ids is not None:
            # Engines capture while walking the layers, so the states are concatenated in layer order
            # (vLLM's set_aux_hidden_state_layers even stores sorted(set(ids))), whatever the config's order.
            reading.aux_layer_ids = sorted(set(reading.aux_layer_ids))
        return reading


def eaglekit_block(cfg: DraftConfig, fmt: str, extra: dict | None = None) -> dict:
    """The block every config eaglekit writes carries, so a later import or doctor never guesses a convention."""
    block = {
        "aux_layer_ids": list(cfg.aux_layer_ids),
        "aux_layer_convention": AUX_CONVENTION,
        "target_num_layers": cfg.target_num_layers,
        "format": fmt,
        "version": __version__,
    }
    block.update(extra or {})
    return block


def defaults(num_layers: int | None) -> list[int] | None:
    return default_aux_layer_ids(num_layers) if num_layers else None


def layer_param(bare: str, prefix: str) -> bool:
    return bare.startswith(prefix) and bare[len(prefix) :] in LAYER_PARAMS


def missing(loads: dict[str, str], skip: tuple[str, ...] = (), layout: tuple[str, ...] = ()) -> list[str]:
    return [n for n in REQUIRED + layout if n not in loads.values() and n not in skip]
