"""What ``python -m evolrl fit`` adds to a Lightning trainer to run as a cluster job, and where it resumes from."""

from __future__ import annotations

import shlex
import sys
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from evolrl.callbacks.progress_lines import LineProgress
from evolrl.checkpoints.atomic import AtomicCheckpointIO
from evolrl.checkpoints.preemption import Preemption
from evolrl.checkpoints.record import RunRecord
from evolrl.checkpoints.resume import RunConfig, checkpoint_meta, differences, report
from evolrl.checkpoints.run_dir import newest_checkpoint, own_dir


def job_parts(config: dict[str, Any], settings: dict[str, Any], given: list[str]) -> list:
    """The callbacks a trainer built from ``config`` (its keyword arguments) gets, with ``AtomicCheckpointIO`` added to
    its plugins unless one writes checkpoints: the preemption handler, ``settings`` travelling in checkpoints, the
    run's record (``record.RunRecord``), and progress as lines where standard output is not a terminal. ``given``: the
    command line's arguments."""
    plugins = config.get("plugins") or []
    plugins = plugins if isinstance(plugins, list) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        config["plugins"] = [*plugins, AtomicCheckpointIO()]
    callbacks = [Preemption(resume_command(given)), RunConfig(settings), RunRecord()]
    bar = any(isinstance(c, ProgressBar) for c in config.get("callbacks") or [])
    if config.get("enable_progress_bar", True) is not False and not bar and not sys.stdout.isatty():
        callbacks.append(LineProgress())
    return callbacks


def own_checkpoint_dir(trainer) -> None:
    """``<default_root_dir>/checkpoints`` for each ``ModelCheckpoint`` without a ``dirpath``, not the logger's versioned
    directory: a requeued run, whose logger starts a new version, finds them there."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = str(own_dir(trainer))


def resume_command(given: list[str]) -> str:
    """``python -m evolrl`` with the ``given`` arguments and ``--ckpt_path last`` in place of any other."""
    args, skip = [], False
    for arg in given:
        if skip or arg.startswith("--ckpt_path="):
            skip = False
            continue
        skip = arg == "--ckpt_path"
        if not skip:
            args.append(arg)
    return shlex.join(["python", "-m", "evolrl", *args, "--ckpt_path", "last"])


def say(text: str) -> None:
    if rank_zero_only.rank == 0:
        print(text, flush=True)


def resume_point(given: str | None, directory: Path, settings: dict[str, Any], hparams: dict[str, Any],
                 weights_only: bool | None = None) -> tuple[Path | None, list[tuple[str, Any, Any]]]:
    """``--ckpt_path`` resolved (``last``: the newest checkpoint in ``directory``; none: ``None``, said so) and the
    settings that differ from the checkpoint's, listed (``settings`` now; a checkpoint saved outside the CLI is
    compared by the module's ``hparams``); read as ``fit`` reads it (``weights_only``: ``--weights_only``)."""
    if given is None:
        return None, []
    path = newest_checkpoint(directory) if given == "last" else Path(given)
    if path is None:
        say(f"evolrl: no checkpoint under {directory}: starting at step 0")
        return None, []
    meta = checkpoint_meta(path, weights_only)
    if meta.get("evolrl_config") is not None:
        changes = differences(meta["evolrl_config"], settings)
    else:
        changes = differences({"model": meta.get("hyper_parameters", {})}, {"model": hparams})
    say(report(path, int(meta.get("global_step", 0)), changes))
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")  # it resumes
    return path, changes
