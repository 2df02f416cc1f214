"""Data-parallel plumbing for `torchrun`: process group, device per rank, reductions.

Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) each rank trains a full draft replica on its
own batches (DDP, NCCL on GPUs, gloo on CPU); without it everything is a no-op for one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from eaglekit.errors import EaglekitError
from eaglekit.targets import load as target_load


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks (in place; also returned). Tensors travel on the rank's device."""
        if self.enabled:
            dist.all_reduce(tensor)
        return tensor

    def broadcast_float(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(t, 0)
        return float(t.item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


def setup(device: str) -> Dist:
    """Join the torchrun process group if launched by torchrun; pick this rank's device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    base = torch.device(target_load.resolve_device(device))
    if world <= 1:
        return Dist(device=base)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if base.type == "cuda":
        if local >= torch.cuda.device_count():
            raise EaglekitError(
                f"local rank {local} but only {torch.cuda.device_count()} GPUs",
                hint="use --nproc_per_node <= the number of GPUs",
            )
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    return Dist(rank=rank, world_size=world, local_rank=local, device=dev)
