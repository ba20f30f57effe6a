"""The little the training step needs to know about several ranks (FSDP2 via Lightning's ModelParallelStrategy)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def shard(model: nn.Module, mesh) -> nn.Module:
    """FSDP2: shard each transformer block, then the rest of the model, over ``mesh``."""
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers` to shard; FSDP2 sharding expects a decoder LM")
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def global_sum(value: torch.Tensor) -> float:
    """Sum of a scalar over all ranks (itself when not distributed)."""
    if world_size() > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
    return float(value)


def gather_objects(value) -> list:
    """``value`` from every rank, in rank order (``[value]`` when not distributed)."""
    if world_size() == 1:
        return [value]
    out = [None] * world_size()
    dist.all_gather_object(out, value)
    return out
