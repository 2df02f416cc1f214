"""The draft's optimizer (AdamW, or Muon beside AdamW), the learning-rate schedule, and the optimizer
state as safetensors + JSON (no pickle).

The schedule is a pure function of the step (linear warmup, then cosine or linear decay to
`min_lr_ratio` x the peak), set on every optimizer before every step, so a resumed run computes
exactly the rates the uninterrupted run did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from eaglekit.errors import EaglekitError
from eaglekit.train.config import SCHEDULES, TrainConfig  # declared beside the options that take them

# Matrices that Muon leaves to AdamW although they are 2-D: the ones that map tokens (Keller Jordan's
# convention, which speculators follows). The embedding is the target's and frozen; lm_head is trained
# unless --freeze-lm-head.
ADAMW_MATRICES = ("embed_tokens", "lm_head")


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


def muon_names(named_params: list[tuple[str, torch.nn.Parameter]]) -> list[str]:
    """The parameters `--optimizer muon` gives Muon: the 2-D weights of fc and the draft layer."""
    return [n for n, p in named_params if p.dim() == 2 and n.split(".")[0] not in ADAMW_MATRICES]


def make_muon(params: list[torch.nn.Parameter], *, lr: float, momentum: float, weight_decay: float):
    """torch.optim.Muon. match_rms_adamw scales each matrix's orthogonalized update to the RMS AdamW's
    would have, so a Muon learning rate reads as an AdamW one (--muon-lr defaults to --lr)."""
    if not hasattr(torch.optim, "Muon"):
        raise EaglekitError(
            f"--optimizer muon needs torch.optim.Muon (PyTorch 2.9 or later); this is PyTorch {torch.__version__}",
            hint="upgrade torch, or train with --optimizer adamw",
        )
    return torch.optim.Muon(params, lr=lr, momentum=momentum, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")


@dataclass
class OptimizerPart:
    optimizer: torch.optim.Optimizer
    names: list[str]  # its parameters' names, in its order (its groups', one after the other)
    peak_lr: float  # what the schedule scales

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer, named_params: list[tuple[str, torch.nn.Parameter]], peak_lr: float):
        name_of = {id(p): n for n, p in named_params}
        return cls(optimizer, [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]], peak_lr)


class DraftOptimizer:
    """The draft's optimizers, stepped as one: AdamW over every trained parameter (`--optimizer adamw`), or
    Muon over the matrices of `muon_names` and AdamW over the rest (`--optimizer muon`)."""

    def __init__(self, parts: dict[str, OptimizerPart]):
        self.parts = parts

    def set_lr(self, lr_of: Callable[..., float]) -> None:
        """This step's learning rates: the one schedule (`lr_of`, `lr_at` at this step) from each
        optimizer's own peak."""
        for part in self.parts.values():
            lr = lr_of(lr=part.peak_lr)
            for group in part.optimizer.param_groups:
                group["lr"] = lr

    def lr(self, kind: str = "adamw") -> float:
        return self.parts[kind].optimizer.param_groups[0]["lr"]

    def step(self) -> None:
        for part in self.parts.values():
            part.optimizer.step()

    def zero_grad(self) -> None:
        for part in self.parts.values():
            part.optimizer.zero_grad(set_to_none=True)

    def names(self) -> dict[str, list[str]]:
        """Which optimizer trains which parameters (the manifest records it)."""
        return {kind: list(part.names) for kind, part in self.parts.items()}

    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Every optimizer's state: tensors by `<param name>.<state key>` (the names are unique over
        the optimizers), the rest as JSON by optimizer."""
        tensors, meta = {}, {}
        for kind, part in self.parts.items():
            part_tensors, meta[kind] = optimizer_tensors(part.optimizer, part.names)
            tensors.update(part_tensors)
        return tensors, meta

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Inverse of `state_tensors`."""
        if "names" in meta:
            # Written before --optimizer existed, by one AdamW, its tensors named by the trainable
            # parameters' order, not the optimizer's (norms after matrices): read them as written.
            (part,) = self.parts.values()
            if sorted(meta["names"]) != sorted(part.names):
                raise EaglekitError(
                    "saved optimizer state is for other parameters", hint="resume with the same draft settings"
                )
            load_optimizer_tensors(part.optimizer, tensors, meta, meta["names"])
            return
        for kind, part in self.parts.items():
            load_optimizer_tensors(part.optimizer, tensors, meta[kind], part.names)


def make_draft_optimizer(named_params: list[tuple[str, torch.nn.Parameter]], cfg: TrainConfig) -> DraftOptimizer:
    """The optimizer(s) of `cfg.optimizer` over the trainable draft parameters (in `named_params`' order)."""
    adamw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, betas=tuple(cfg.betas))
    if cfg.optimizer == "adamw":
        return DraftOptimizer({"adamw": OptimizerPart.of(make_optimizer(named_params, **adamw), named_params, cfg.lr)})
    to_muon = set(muon_names(named_params))
    muon = [(n, p) for n, p in named_params if n in to_muon]
    rest = [(n, p) for n, p in named_params if n not in to_muon]
    lr = cfg.muon_peak_lr
    muon_optimizer = make_muon(
        [p for _, p in muon], lr=lr, momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay
    )
    return DraftOptimizer(
        {
            "muon": OptimizerPart.of(muon_optimizer, muon, lr),
            "adamw": OptimizerPart.of(make_optimizer(rest, **adamw), rest, cfg.lr),
        }
    )


def optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """Flatten the optimizer state: tensors by `<param name>.<state key>`, the rest as JSON.

    Args:
        optimizer: the optimizer.
        names: parameter names in the optimizer's parameter order (its groups', one after the other).
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
        # JSON turned tuples (AdamW's betas, Muon's ns_coefficients) into lists
        group = {k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in saved.items()}
        group["params"] = current["params"]
        groups.append(group)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
