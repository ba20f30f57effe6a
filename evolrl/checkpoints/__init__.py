"""A run on a cluster: atomic checkpoint files, the run's own checkpoint directory, preemption, and resuming with
the settings given now (``python -m evolrl`` puts each in place; each also works in a plain Lightning trainer)."""

from evolrl.checkpoints.atomic import AtomicCheckpointIO, CheckpointError, atomic_save, read_checkpoint
from evolrl.checkpoints.preemption import Preempted, Preemption
from evolrl.checkpoints.resume import RunConfig, checkpoint_meta, differences, refused, report
from evolrl.checkpoints.run_dir import DirectoryInUse, RunLock, check_writable, checkpoint_dir, newest_checkpoint

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointError",
    "DirectoryInUse",
    "Preempted",
    "Preemption",
    "RunConfig",
    "RunLock",
    "atomic_save",
    "check_writable",
    "checkpoint_dir",
    "checkpoint_meta",
    "differences",
    "newest_checkpoint",
    "read_checkpoint",
    "refused",
    "report",
]
