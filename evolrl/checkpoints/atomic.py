"""Checkpoint files written next to their target and renamed into place, and read with an error that names them.

Lightning's own save writes through fsspec, which stages a local file in ``$TMPDIR`` and moves it into place: on a
cluster ``$TMPDIR`` is a local disk and the checkpoint directory a shared one, so the move is a copy, and a full disk
or a kill during it leaves a truncated file under the final name. Here the bytes go to ``<name>.partial`` in the
target's own directory, are flushed to disk, and ``os.replace`` (atomic within one filesystem) puts them in place, as
TorchTitan's checkpointer does. A failed save removes its partial file and leaves the previous checkpoint as it was.
FSDP2's sharded directories get the same treatment from :class:`evolrl.distributed.ModelParallelStrategy`.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.plugins.io import TorchCheckpointIO


class CheckpointError(OSError):
    """A checkpoint could not be written or read; the message names the file and what to do."""


PARTIAL = ".partial"
"""The suffix of a checkpoint being written; never a checkpoint to resume from."""


def atomic_save(checkpoint: dict[str, Any], path: Path) -> None:
    """``torch.save`` into ``<path>.partial`` beside ``path``, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + PARTIAL)
    try:
        with open(partial, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException as err:
        partial.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise CheckpointError(f"could not write the checkpoint {path}: {err.strerror or err}; no file "
                                  "was left under that name and the previous checkpoints are as they were "
                                  "(free space, or point trainer.default_root_dir elsewhere, then resume with "
                                  "--ckpt_path last)") from err
        raise


def read_checkpoint(path: Path, **load_kwargs: Any) -> dict[str, Any]:
    """``torch.load`` of ``path``; a :class:`CheckpointError` naming it when it is truncated or not a checkpoint."""
    try:
        return torch.load(path, **load_kwargs)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except pickle.UnpicklingError as err:
        if not str(err).startswith("Weights only load failed"):
            raise _unreadable(path, err) from None
        held = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        raise CheckpointError(f"checkpoint {path} is whole but not loadable with weights_only=True: it holds "
                              f"{held.group(1) if held else 'an object'} (e.g. from a callback's state), which "
                              "torch.load loads only with weights_only=False; if you trust the file, resume with "
                              "--weights_only false") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:  # a cut zip: RuntimeError
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: BaseException) -> CheckpointError:
    first = str(err).splitlines()[0].split(". ")[0] if str(err) else ""
    return CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}: {first}): it is truncated or "
                           f"not a checkpoint; resume from another one in {path.parent}")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` with :func:`atomic_save` for local paths and :func:`read_checkpoint`'s
    errors (remote URLs go through Lightning's own code)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        atomic_save(checkpoint, Path(path))

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        if not _is_local_file_protocol(path):
            return super().load_checkpoint(path, map_location, weights_only)
        return read_checkpoint(Path(path), map_location=map_location, weights_only=weights_only)
