"""The little the training step needs to know about several ranks (FSDP2 via Lightning's ModelParallelStrategy)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
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


class ModelParallelStrategy(_LightningModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2), with sharded checkpoints written atomically.

    Lightning writes a sharded checkpoint's files straight into its directory, so a kill or a full
    disk in the middle of re-saving ``last.ckpt`` leaves neither the old checkpoint nor the new one.
    Here every rank writes into ``<name>.partial``; only once all shards and ``meta.pt`` are complete
    does rank 0 swap it into place (the previous checkpoint is removed after the swap).
    """

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        partial, previous = path.with_name(path.name + ".partial"), path.with_name(path.name + ".previous")
        if self.is_global_zero:
            _remove(partial)
        self.barrier()
        try:
            super().save_checkpoint(checkpoint, partial, storage_options)
        except BaseException:
            if self.is_global_zero:
                _remove(partial)
            raise
        self.barrier()
        if self.is_global_zero:
            _remove(previous)
            if path.exists():
                path.rename(previous)
            partial.rename(path)
            _remove(previous)
        self.barrier()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
