"""eaglekit's native draft checkpoint: `config.json` + `model.safetensors` (+ `manifest.json`).

Tensor names are the SGLang names (`fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`,
`d2t`, `t2d`); the target's embedding is not stored (it is the target's, frozen). Weights are kept
in float32 so training resumes exactly; exports cast.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglekit.artifacts import atomic_path, write_json
from eaglekit.draft.config import DraftConfig
from eaglekit.draft.model import Eagle3Draft
from eaglekit.errors import EaglekitError
from eaglekit.targets.source import validate_safetensors

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def save_draft(draft: Eagle3Draft, out_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json and model.safetensors atomically; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in draft.draft_state_dict().items():
        t = t.detach().to("cpu")
        tensors[name] = t.to(dtype) if t.is_floating_point() else t
    with atomic_path(out / WEIGHTS) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"format": "pt"})
    write_json(out / CONFIG, draft.config.to_hf_dict())
    return out


def check_finite(tensors: dict[str, torch.Tensor], where: str | Path) -> None:
    """Refuse weights holding NaN or Inf, naming the tensor: such a draft runs without an error and is
    never accepted (a training run that diverged, a broken conversion, a float16 overflow).

    Raises:
        EaglekitError: the first float tensor (in name order) that is not finite everywhere.
    """
    for name in sorted(tensors):
        t = tensors[name]
        # max and min propagate NaN and hold any Inf: on CPU bf16 a few times cheaper than isfinite
        if not t.is_floating_point() or not t.numel() or (torch.isfinite(t.amax()) and torch.isfinite(t.amin())):
            continue
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        what = " and ".join(f"{n:,} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf")) if n)
        raise EaglekitError(
            f"draft {where}: tensor {name} holds {what} of its {t.numel():,} values; a draft with "
            f"non-finite weights is never accepted",
            hint="train it again (eaglekit train stops at the first non-finite step and says why), "
            "or use another checkpoint",
        )


def load_draft_config(folder: str | Path) -> DraftConfig:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise EaglekitError(f"{folder} has no config.json", hint="pass a draft checkpoint folder")
    try:
        return DraftConfig.from_hf_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as err:
        raise EaglekitError(f"{path} is not valid JSON", hint="the checkpoint is corrupt") from err


def load_draft(
    folder: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    target_embedding: torch.Tensor | None = None,
) -> Eagle3Draft:
    """Load a native draft checkpoint. Pass the target's input embedding to make it runnable.

    Raises:
        EaglekitError: missing/corrupt files, tensor names/shapes that do not match the config, or
            weights holding NaN/Inf.
    """
    folder = Path(folder)
    config = load_draft_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise EaglekitError(f"{folder} has no {WEIGHTS}", hint="pass a draft checkpoint folder")
    validate_safetensors(weights)
    state = load_file(str(weights))
    check_finite(state, folder)
    draft = Eagle3Draft(config)
    expected = draft.draft_state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise EaglekitError(
            f"draft weights do not match the config: missing {missing[:6]}, unexpected {unexpected[:6]}",
            hint="for SGLang/vLLM/EAGLE folders use `eaglekit import`",
        )
    for name, t in state.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise EaglekitError(
                f"tensor {name} is {tuple(t.shape)}, the config implies {tuple(expected[name].shape)}",
                hint="config.json and model.safetensors disagree",
            )
    draft.load_state_dict(state, strict=False)
    if target_embedding is not None:
        draft.set_target_embedding(target_embedding)
    return draft.to(device=device, dtype=dtype)
