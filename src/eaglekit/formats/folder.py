"""Read any draft folder as it is on disk: config.json, safetensors weights, optional manifest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from eaglekit.artifacts import MANIFEST, TRAIN_LOG, TRAINER_STATE, read_json, unfinished_reason
from eaglekit.errors import EaglekitError
from eaglekit.targets.source import validate_safetensors

INDEX = "model.safetensors.index.json"


@dataclass
class DraftFolder:
    """A draft folder's raw contents: nothing renamed, nothing converted."""

    path: Path
    config: dict
    tensors: dict[str, torch.Tensor]
    manifest: dict | None

    @property
    def eaglekit(self) -> dict | None:
        """The `eaglekit` block eaglekit writes into every config it produces, if any."""
        block = self.config.get("eaglekit")
        return block if isinstance(block, dict) else None

    @property
    def unfinished(self) -> str | None:
        """Why the draft is unfinished (training stopped early), from its manifest or its config's
        `eaglekit` block (an export of an unfinished draft carries the mark), else None."""
        if self.manifest is None and (self.path / TRAINER_STATE).is_dir():  # killed before its first manifest
            return f"its `eaglekit train` run in {self.path} holds a trainer state but wrote no manifest yet"
        return unfinished_reason(self.manifest) or (self.eaglekit or {}).get("unfinished")

    @property
    def recorded_target(self) -> dict | None:
        """The target fingerprint the folder records: its manifest's, else its config's `eaglekit` block's."""
        return (self.manifest or {}).get("target") or (self.eaglekit or {}).get("target")


def unfinished_training(path: Path) -> str | None:
    """Why a folder is an unfinished training run (its manifest says `complete: false`, or it holds
    a trainer state or log and no manifest yet), else None."""
    if (path / MANIFEST).is_file():
        try:
            return unfinished_reason(json.loads((path / MANIFEST).read_text()))
        except (OSError, ValueError, AttributeError):
            return None
    if (path / TRAINER_STATE).is_dir() or (path / TRAIN_LOG).is_file():
        return f"its `eaglekit train` run in {path} wrote no manifest yet (killed or still running)"
    return None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder (following a shard index when there is one)."""
    if (path / INDEX).is_file():
        index = read_json(path / INDEX, what="safetensors index")
        return [path / name for name in sorted(set(index.get("weight_map", {}).values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if pickles:
            raise EaglekitError(
                f"{path} holds only pickle weights ({', '.join(pickles)})",
                hint="eaglekit reads safetensors only; convert them with the trainer that wrote them",
            )
        if (path / TRAINER_STATE).is_dir():
            raise EaglekitError(
                f"{path} is an `eaglekit train` run that has saved no draft yet",
                hint="let it run to its first validation, or resume it with --resume",
            )
        raise EaglekitError(f"{path} has no *.safetensors weights", hint="pass a draft folder")
    return files


def read_folder(path: str | Path) -> DraftFolder:
    """Read config.json, every safetensors file and manifest.json (if present) of a draft folder.

    Raises:
        EaglekitError: not a folder, no config, pickle-only or truncated weights, duplicate names.
    """
    path = Path(path)
    if not path.is_dir():
        raise EaglekitError(f"no such draft folder: {path}", hint="pass the folder holding config.json")
    if not (path / "config.json").is_file():
        unfinished = unfinished_training(path)
        if unfinished:  # a killed `eaglekit train` before its first draft: "config not found" sent users to the path
            raise EaglekitError(
                f"{path} is unfinished: {unfinished}, and has saved no draft yet",
                hint="continue it with the same `eaglekit train` command plus --resume (or let "
                "it run to its first validation)",
            )
    config = read_json(path / "config.json", what="draft config")
    if not isinstance(config, dict):
        raise EaglekitError(f"{path / 'config.json'} is not a JSON object", hint="the file is corrupt")
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        if not file.is_file():
            raise EaglekitError(f"{file} is listed in {INDEX} but missing", hint="is the download complete?")
        validate_safetensors(file)
        for name, tensor in load_file(str(file)).items():
            if name in tensors:
                raise EaglekitError(f"tensor {name} appears in two weight files", hint="the shards overlap")
            tensors[name] = tensor
    manifest = None
    if (path / MANIFEST).is_file():
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except json.JSONDecodeError as err:
            raise EaglekitError(f"{path / MANIFEST} is not valid JSON", hint="the file is corrupt") from err
    return DraftFolder(path=path, config=config, tensors=tensors, manifest=manifest)
