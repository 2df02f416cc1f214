"""Trainer state for an exact `--resume`: safetensors for tensors, JSON for the rest, no pickle.

    OUT/trainer_state/latest.json          {"step": N, "dir": "step-0000N"}  (replaced atomically)
    OUT/trainer_state/step-0000N/
        draft.safetensors      every draft tensor in float32 (the training weights, d2t, t2d)
        optimizer.safetensors  AdamW moments and step counters (and Muon's momentum), named `<param>.<key>`
        rng.safetensors        torch CPU (and CUDA) generator states
        state.json             step, resolved config, each optimizer's groups, best metrics, history

A state folder is written beside the others and only then named in latest.json; older folders are
deleted afterwards, so a kill at any moment leaves one complete state to resume from.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglekit.artifacts import TRAINER_STATE, atomic_path, read_json, write_json
from eaglekit.errors import EaglekitError
from eaglekit.targets.source import validate_safetensors

log = logging.getLogger(__name__)
STATE_DIR = TRAINER_STATE
LATEST = "latest.json"


def rng_tensors() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda{i}"] = s
    return states


def restore_rng(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    cuda = [states[k] for k in sorted(states) if k.startswith("cuda")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def save_state(
    out: Path,
    *,
    step: int,
    draft_tensors: dict[str, torch.Tensor],
    optimizer_tensors: dict[str, torch.Tensor],
    state: dict,
    keep: int = 1,
) -> Path:
    """Write one complete trainer state and point latest.json at it."""
    root = out / STATE_DIR
    name = f"step-{step:08d}"
    folder = root / name
    tmp = root / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in draft_tensors.items()}, str(tmp / "draft.safetensors"))
    save_file(optimizer_tensors, str(tmp / "optimizer.safetensors"))
    save_file({k: v.contiguous() for k, v in rng_tensors().items()}, str(tmp / "rng.safetensors"))
    write_json(tmp / "state.json", state)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    write_json(root / LATEST, {"step": step, "dir": name})
    old = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != name)
    for path in old[: max(len(old) - (keep - 1), 0)]:
        shutil.rmtree(path, ignore_errors=True)
    return folder


def latest_state(out: Path) -> Path | None:
    pointer = out / STATE_DIR / LATEST
    if not pointer.is_file():
        return None
    folder = out / STATE_DIR / read_json(pointer, what="trainer state pointer")["dir"]
    if not folder.is_dir():
        raise EaglekitError(
            f"{pointer} names {folder.name}, which is missing",
            hint="the trainer state is damaged; start a new run without --resume",
        )
    return folder


def load_state(folder: Path) -> tuple[dict, dict, dict, dict]:
    """(state.json, draft tensors, optimizer tensors, rng tensors) of a trainer state folder."""
    parts = []
    for name in ("draft.safetensors", "optimizer.safetensors", "rng.safetensors"):
        path = folder / name
        if not path.is_file():
            raise EaglekitError(f"trainer state {folder} lacks {name}", hint="start a new run without --resume")
        validate_safetensors(path)
        parts.append(load_file(str(path)))
    return (read_json(folder / "state.json", what="trainer state"), *parts)


def write_log_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def truncate_log(path: Path, step: int) -> None:
    """On resume, drop log lines written after the resumed step (they will be written again).

    A malformed last line is the torn write of a killed run and is dropped; a malformed line
    before it means the log is corrupt, and deleting it quietly would hide that.

    Raises:
        EaglekitError: a line other than the last is not a JSON object.
    """
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict):
            if number == len(lines):
                log.warning("%s:%d: dropping a torn last line (the killed run was writing it)", path, number)
                continue
            raise EaglekitError(
                f"{path}:{number} is not a JSON object: {line[:200]!r}",
                hint="the training log is corrupt: repair or delete that line, then --resume again",
            )
        if record.get("step", 0) <= step:
            kept.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
