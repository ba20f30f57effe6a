"""The little the training step needs to know about several ranks (FSDP2 via Lightning's ModelParallelStrategy)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy as _LightningModelParallelStrategy
from torch import nn


def shard(model: nn.Module, mesh, param_dtype: torch.dtype | None = None) -> nn.Module:
    """FSDP2: shard each transformer block, then the rest of the model, over ``mesh``.

    ``param_dtype`` (FSDP2's ``MixedPrecisionPolicy``): the dtype of the full copies each block all-gathers for its
    forward and backward; the shards, which the optimizer updates, keep their own dtype, and gradients are
    reduced in float32 and land in the shards' dtype. ``None``: all-gather the shards' dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = _blocks(model)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers` to shard; FSDP2 sharding expects a decoder LM")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _blocks(model) -> nn.ModuleList | None:
    """A decoder LM's blocks; ``None`` for anything else, such as a LoRA run's reference (``lora.AdaptersOff``, a
    wrapper of the policy whose blocks are the policy's, held or freed with it)."""
    return getattr(getattr(model, "model", None), "layers", None) if isinstance(model, nn.Module) else None


def sync_gradients(model: nn.Module, sync: bool, hold: bool = False) -> None:
    """Under FSDP2, whether the next backward reduce-scatters the gradients (``sync``) and whether it leaves the
    gathered weights in place for the next pass (``hold``: the weights do not change between a mini-batch's passes).
    The update syncs on a mini-batch's last pass only (one reduce-scatter per optimizer step, the earlier passes
    accumulating unsharded gradients; ``Batching.reduce_every_pass``: every pass); every rank runs as many passes
    (``plan.lockstep``), so all reduce at the same one. A no-op without FSDP2."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(sync)
        model.set_reshard_after_backward(not hold)


@contextmanager
def gathered_until_backward(model: nn.Module | None, hold: bool) -> Iterator[None]:
    """With ``hold``, ``model``'s FSDP2 blocks keep their gathered weights from a forward to its backward (FSDP2's
    ``reshard_after_forward=False``), and a pass without gradients leaves them for the next pass; on exit they are
    freed. A no-op without FSDP2 or without ``hold``."""
    blocks = [b for b in _blocks(model) or [] if hasattr(b, "set_reshard_after_forward")] if hold else []
    for block in blocks:
        block.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for block in blocks:
            block.set_reshard_after_forward(True, recurse=False)
            block.reshard()


def fill_from_rank0(model: nn.Module, state: dict[str, torch.Tensor] | None, device: torch.device) -> nn.Module:
    """Give a model sharded on the meta device its weights: ``state``, the full state dict that rank 0 holds.

    Every rank allocates its own shards on ``device`` and receives its slice of each tensor from rank 0, one
    tensor at a time, cast to its shards' dtype (other ranks pass ``state=None``). Buffers keep the values they
    were built with (non-persistent ones, like rotary frequencies, are in no state dict).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)  # to_empty also empties the buffers: put them back
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # A copy: set_model_state_dict replaces the dict's entries with this model's shards, and the caller may reuse it.
    set_model_state_dict(model, dict(state) if dist.get_rank() == 0 else {}, options=options)
    return model


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank (picklable)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce(value: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``value`` summed (``op="sum"``) or its elementwise largest taken (``"max"``) over all ranks; itself when not
    distributed."""
    if world_size() > 1:
        value = value.detach().clone()
        dist.all_reduce(value, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return value


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
