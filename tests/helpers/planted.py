"""Plant a defect in a draft export: `planted(src, dst, config=..., tensors=...)` copies it and edits
its config, tensors or manifest; the edits shared by the doctor's, the probe's and the engines' tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def planted(src: Path, dst: Path, *, config=None, tensors=None, manifest=None) -> Path:
    """A copy of an export with a defect planted by editing its config, tensors or manifest."""
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        state = load_file(str(dst / "model.safetensors"))
        state = tensors(state) or state
        save_file(state, str(dst / "model.safetensors"))
    if manifest:
        data = json.loads((dst / "manifest.json").read_text())
        manifest(data)
        (dst / "manifest.json").write_text(json.dumps(data))
    return dst


def _rename_layers(state):
    return {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}


def _d2t_absolute(state):
    state["d2t"] = state["d2t"] + torch.arange(state["d2t"].shape[0])


def _aux_off_by_one(cfg):
    # the SGLang-convention ids (= eaglekit's) written top-level, where vLLM reads them one layer early
    cfg["eagle_aux_hidden_state_layer_ids"] = list(cfg["eaglekit"]["aux_layer_ids"])


def _aux_off(cfg):
    cfg["transformer_layer_config"]["eagle_config"] = {"use_aux_hidden_state": False}
