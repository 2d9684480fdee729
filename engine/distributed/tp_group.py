"""The tensor-parallel process group as the model's layers use it: one object per rank.

Only the collectives the sharded layers need, on the default torch.distributed group (gloo on
CPU, NCCL on CUDA). Every collective has the group's timeout, so a rank that died or hangs
makes the others raise instead of waiting forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from loraplex.engine.distributed.sharding import TPLayout

# How long a collective waits for the other ranks before raising (a dead worker's peers
# usually see its closed connection at once; this bounds a hung one).
COLLECTIVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TPGroup:
    rank: int
    world_size: int

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place; returns it."""
        dist.all_reduce(tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `tensor` (same shape everywhere) concatenated along `dim`, rank order."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)


def init_tp_group(rank: int, world_size: int, init_method: str, device: torch.device) -> TPGroup:
    """Join the group (blocks until every rank has joined, or the timeout)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    return TPGroup(rank, world_size)


def destroy_tp_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class TensorParallel:
    """What a sharded model is built with: the group and this rank's share of the model."""

    group: TPGroup
    layout: TPLayout
