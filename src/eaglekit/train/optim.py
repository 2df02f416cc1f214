"""AdamW, the learning-rate schedule, and the optimizer state as safetensors + JSON (no pickle).

The schedule is a pure function of the step (linear warmup, then cosine or linear decay to
`min_lr_ratio` x lr), set on the optimizer before every step, so a resumed run computes exactly the
rates the uninterrupted run did.
"""

from __future__ import annotations

import math

import torch

from eaglekit.errors import EaglekitError
from eaglekit.train.config import SCHEDULES  # declared beside the option that takes it


def lr_at(
    step: int, *, lr: float, warmup_steps: int, total_steps: int, schedule: str = "cosine", min_lr_ratio: float = 0.0
) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        factor = 1.0 - progress
    else:
        raise EaglekitError(f"unknown schedule {schedule!r}", hint=f"use one of {SCHEDULES}")
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * factor)


def make_optimizer(
    named_params: list[tuple[str, torch.nn.Parameter]], *, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW over the trainable draft parameters; norms' weights get no weight decay.

    foreach=None: PyTorch's choice, the multi-tensor kernels on a GPU (a few launches a step for all
    parameters, not ~8 each) and the per-parameter loop on a CPU. Both hold the same state.
    """
    decay = [p for n, p in named_params if p.dim() >= 2]
    plain = [p for n, p in named_params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas, foreach=None)


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """Flatten the optimizer state: tensors by `<param name>.<state key>`, the rest as JSON.

    Args:
        optimizer: the optimizer.
        names: parameter names in the optimizer's parameter order (as given to `make_optimizer`).
    """
    sd = optimizer.state_dict()
    order = [i for g in sd["param_groups"] for i in g["params"]]
    if len(order) != len(names):
        raise EaglekitError("optimizer and parameter names disagree", hint="internal error")
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict] = {}
    for index, name in zip(order, names):
        for key, value in sd["state"].get(index, {}).items():
            if torch.is_tensor(value):
                tensors[f"{name}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(name, {})[key] = value
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"} for g in sd["param_groups"]
    ]
    return tensors, {"param_groups": groups, "scalars": scalars, "names": names}


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict, names: list[str]
) -> None:
    """Inverse of `optimizer_tensors` (state tensors are moved to their parameters' devices)."""
    if meta.get("names") != names:
        raise EaglekitError("saved optimizer state is for other parameters", hint="resume with the same draft settings")
    sd = optimizer.state_dict()
    order = [i for g in sd["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state: dict[int, dict] = {}
    for index, name, param in zip(order, names, params):
        entry = {}
        prefix = f"{name}."
        for key, value in tensors.items():
            if key.startswith(prefix) and "." not in key[len(prefix) :]:
                entry[key[len(prefix) :]] = (
                    value.to(param.device) if key.endswith(".step") else value.to(param.device, param.dtype)
                )
        entry.update(meta["scalars"].get(name, {}))
        if entry:
            state[index] = entry
    groups = []
    for saved, current in zip(meta["param_groups"], sd["param_groups"]):
        group = dict(saved)
        group["params"] = current["params"]
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
