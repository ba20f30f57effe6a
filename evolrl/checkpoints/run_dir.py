"""A run's checkpoint directory: where it is, whether it can be written, which run holds it, and what ``last`` is.

One run, one directory. A run holds an exclusive lock on ``<dir>.lock`` beside it (``flock``, which the kernel drops
when the process ends, however it ends; it works on local disks and on NFS and Lustre mounts with locking on; beside,
not inside, so that a directory holding checkpoints still draws Lightning's warning), so a second run
started on a directory in use is refused at start, naming the holder, before a model loads. A requeued run finds the
lock free: the one that held it is gone. ``--ckpt_path last`` is then the newest complete checkpoint in this
directory, the run's own, never another directory's.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from evolrl.checkpoints.atomic import PARTIAL, CheckpointError

LOCK = ".lock"
"""The suffix of the lock file beside a checkpoint directory."""
PREVIOUS = ".previous"
"""A sharded checkpoint's old directory while its new one is renamed into place (``distributed.py``)."""


def own_dir(trainer) -> Path:
    """``<default_root_dir>/checkpoints``: the run's checkpoint directory unless a ``ModelCheckpoint`` names one."""
    return Path(trainer.default_root_dir) / "checkpoints"


def checkpoint_dir(trainer) -> Path:
    """The first ``ModelCheckpoint``'s ``dirpath``, else :func:`own_dir`."""
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return Path(dirpath) if dirpath else own_dir(trainer)


def newest_checkpoint(directory: Path) -> Path | None:
    """The most recently written complete checkpoint (a ``.ckpt`` file, or an FSDP2 ``.ckpt`` directory) in
    ``directory``; a sharded one caught between its old and new directory counts by its old one."""
    if not directory.is_dir():
        return None
    found = [p for p in directory.iterdir() if p.name.endswith(".ckpt")]
    found += [p for p in directory.iterdir() if p.name.endswith(".ckpt" + PREVIOUS)
              and not p.with_name(p.name.removesuffix(PREVIOUS)).exists()]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def check_writable(directory: Path) -> None:
    """Create ``directory`` and a file in it, or a :class:`CheckpointError` naming it, before any step runs."""
    probe = directory / f".write-test-{os.getpid()}{PARTIAL}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        reason = err.strerror or str(err)
        raise CheckpointError(f"the checkpoint directory {directory} cannot be written ({reason}): set "
                              "trainer.default_root_dir (or the ModelCheckpoint's dirpath) to a directory this job "
                              "can write") from None


class DirectoryInUse(CheckpointError):
    """Another live run holds the checkpoint directory; ``holder`` is the line it wrote in the lock file."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class RunLock:
    """An exclusive lock on a checkpoint directory for this process's lifetime (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory.with_name(directory.name + LOCK)
        self.file = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise DirectoryInUse(f"the checkpoint directory {self.directory} is in use by another run ({holder})"
                                 ": give this run its own trainer.default_root_dir; two runs in one directory would "
                                 "overwrite each other's checkpoints", holder) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                     f"{' '.join(sys.argv)}\n")
        handle.flush()
        self.file = handle

    def holder(self) -> str | None:
        """Who holds the directory now, if another live process does (its lock file's line); ``None`` if it is free.
        Takes and drops the lock to find out."""
        try:
            self.acquire()
        except DirectoryInUse as err:
            return err.holder
        self.release()
        return None

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the only descriptor drops the flock
            self.file = None
