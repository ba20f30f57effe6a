"""What a resumed run is resumed with: the checkpoint's settings against the ones given now.

A resumed run trains with the configuration and command line it is started with, as a first run does. The settings
a checkpoint was saved under travel in it (``checkpoint["evolrl_config"]``, written by :class:`RunConfig`); at
start every one that differs is listed in one block, and only those that cannot work are refused: another model,
another master-weights dtype or other adapters would not fit the saved tensors.

(Lightning's own CLI, given a checkpoint file, would instead parse the checkpoint's hyper-parameters over the
configuration and the command line, silently: ``EvolRLCLI`` turns that off.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from evolrl.checkpoints.atomic import read_checkpoint

REFUSED = ("model.model", "model.dtype", "model.lora")
"""Settings (and everything under them) that a checkpoint's tensors are shaped by."""
IGNORED = ("ckpt_path", "config", "print_config")
"""Not settings of the run: where it resumes from, which files gave the settings."""


def checkpoint_meta(path: Path, weights_only: bool | None = None) -> dict[str, Any]:
    """A checkpoint's contents other than what FSDP2 shards (for a file: all of it, memory-mapped, not read), loaded
    as ``fit`` will load it (``weights_only``: ``--weights_only``; ``None``: torch's default, ``True``)."""
    if path.is_dir():  # FSDP2: the non-sharded state is in meta.pt
        return read_checkpoint(path / "meta.pt", map_location="cpu", weights_only=weights_only)
    return read_checkpoint(path, map_location="cpu", weights_only=weights_only, mmap=True)


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}`` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flat(value, f"{name}.")
        else:
            out[name] = value
    return out


def differences(saved: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, value now)`` for every setting that differs (``<unset>`` where one side lacks it)."""
    before, after = flat(saved), flat(now)
    keys = sorted(k for k in before.keys() | after.keys() if not k.split(".")[0] in IGNORED)
    missing = "<unset>"
    return [(k, before.get(k, missing), after.get(k, missing)) for k in keys
            if before.get(k, missing) != after.get(k, missing)]


def refused(changes: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    return [c for c in changes if any(c[0] == r or c[0].startswith(r + ".") for r in REFUSED)]


def report(path: Path, step: int, changes: list[tuple[str, Any, Any]]) -> str:
    """The block printed at start: the checkpoint, its step, and each setting that differs from it."""
    head = f"evolrl: resuming from {path} (step {step})"
    if not changes:
        return head + " with the settings it was saved with"
    lines = [f"  {key}: {_short(old)} -> {_short(new)}" for key, old, new in changes]
    return "\n".join([head + f"; {len(changes)} setting(s) differ from the checkpoint's, the new value is used:",
                      *lines])


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


class RunConfig(L.Callback):
    """Writes the run's configuration (plain values) into every checkpoint, for :func:`differences` on resume."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer, module, checkpoint: dict) -> None:
        checkpoint["evolrl_config"] = self.config
