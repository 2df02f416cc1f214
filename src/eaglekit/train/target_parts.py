"""What offline training needs from the target without running it: identity, embedding, lm_head.

For an HF folder only the config, the tokenizer and two tensors are read (the names come from the
model built on the meta device, so no per-architecture table); a large target is never loaded.
A GGUF target has no separate tensors to read, so it is loaded (dequantized) whole on the CPU.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from eaglekit.targets.info import load_config
from eaglekit.targets.load import (
    generation_eos_ids,
    load_target,
    load_tokenizer,
    stop_token_ids,
    target_fingerprint,
    text_config,
)
from eaglekit.targets.source import TargetSource, resolve_target

log = logging.getLogger(__name__)


@dataclass
class TargetParts:
    """config: the target's (full) config; embedding [V, H]; lm_head [V, H] (None if absent)."""

    source: TargetSource
    config: object
    tokenizer: object
    fingerprint: dict
    stop_token_ids: list[int]
    embedding: torch.Tensor
    lm_head: torch.Tensor | None

    @property
    def text_config(self):
        return text_config(self.config)


def parameter_names(config) -> tuple[str, str | None, bool]:
    """(input embedding name, output embedding name, tied) from the model built on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    by_id: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), n)  # tied weights: the first (stored) name, usually the embedding's
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    out_name = by_id.get(id(out.weight)) if out is not None else None
    tied = out is not None and out.weight is emb
    return by_id[id(emb)], out_name, tied


def read_tensors(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Read named tensors from an HF folder's safetensors files (only those tensors)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {n: folder / weight_map[n] for n in names if n in weight_map}
    else:
        files = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                keys = set(f.keys())
            files.update({n: path for n in names if n in keys and n not in files})
    found = {}
    for name, path in files.items():
        with safe_open(str(path), framework="pt") as f:
            found[name] = f.get_tensor(name)
    return found


def load_target_parts(spec: str | Path | TargetSource) -> TargetParts:
    """Identity, tokenizer, stop ids, input embedding and lm_head of a target (float32, CPU)."""
    source = spec if isinstance(spec, TargetSource) else resolve_target(spec)
    if source.kind == "hf_dir":
        config = load_config(source)
        gen_eos = generation_eos_ids(source, config)
        tokenizer = load_tokenizer(source, gen_eos)
        emb_name, head_name, tied = parameter_names(config)
        wanted = [emb_name] + ([head_name] if head_name and not tied else [])
        tensors = read_tensors(source.path, wanted)
        # An untied head must be found by name too; otherwise read both from the loaded model.
        if emb_name in tensors and (tied or head_name in tensors):
            embedding = tensors[emb_name].float()
            lm_head = embedding if tied else tensors[head_name].float()
            return TargetParts(
                source,
                config,
                tokenizer,
                target_fingerprint(config, tokenizer, source),
                stop_token_ids(gen_eos, tokenizer),
                embedding,
                lm_head,
            )
        log.info(
            "embedding %r / lm_head %r not found by name in %s; loading the whole target",
            emb_name,
            head_name,
            source.path,
        )
    target = load_target(source, device="cpu", dtype="float32")
    head = target.model.get_output_embeddings()
    return TargetParts(
        source,
        target.model.config,
        target.tokenizer,
        target.fingerprint(),
        target.stop_token_ids,
        target.model.get_input_embeddings().weight.detach().float(),
        head.weight.detach().float() if head is not None else None,
    )
