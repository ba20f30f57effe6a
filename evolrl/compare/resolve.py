"""A run's whole configuration as ``fit`` would save it (its ``config.yaml``), parsed but with nothing built.

The plan holds each run's configuration resolved once, by the CLI's own parser: the base configs, the arm's
overlays and settings, and the run's seed, directory, logger and callbacks. ``fit`` then runs that file alone
(``--config <plan>/<arm>/seed<S>.yaml``), so a run does not depend on overlay files that change after the plan. The
parse stops where ``fit`` would start building the model; what it has changed by then (``data.seed`` following
``seed_everything``, float32 on a CPU without bf16) is in the resolved file as in the run's saved ``config.yaml``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from pathlib import Path

import yaml

from evolrl.cli import EvolRLCLI, main
from evolrl.compare.spec import CompareError

IGNORED = ("ckpt_path",)
"""Top-level keys that are the command's, not the run's (``--ckpt_path last`` on every start)."""


class _Resolved(Exception):
    def __init__(self, text: str) -> None:
        self.text = text


class _Resolver(EvolRLCLI):
    def instantiate_classes(self) -> None:
        raise _Resolved(self._parser(self.subcommand).dump(self.config[self.subcommand], skip_none=False))


def resolve(args: list[str], what: str) -> dict:
    """The configuration ``fit ARGS`` would run; a :class:`CompareError` naming ``what`` with the parser's message."""
    err, seed_lines = io.StringIO(), logging.getLogger("lightning.fabric.utilities.seed")
    level = seed_lines.level
    seed_lines.setLevel(logging.WARNING)  # "Seed set to N", once per run resolved: nothing was seeded
    try:
        with contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the CPU's float32 note: it is in the resolved file
            main(["fit", *args], cli=_Resolver)
    except _Resolved as done:
        config = yaml.safe_load(done.text)
        return {k: v for k, v in config.items() if k not in IGNORED}
    except SystemExit:
        raise CompareError(f"{what}: `python -m evolrl fit` refuses its configuration:\n{err.getvalue().strip()}")
    finally:
        seed_lines.setLevel(level)
    raise CompareError(f"{what}: the configuration parsed without reaching the run")  # pragma: no cover


def run_settings(directory: Path, seed: int, checkpoint_every: int | None, eval_responses: bool) -> list[str]:
    """What every run adds after its arm: its seed (``seed_everything`` and ``data.seed``), its directory (checkpoints
    in ``<dir>/checkpoints``), a TensorBoard logger writing into the directory itself, the held-out responses
    (``EvalResponses``, unless the configs have one) and a checkpoint every ``checkpoint_every`` steps (else only at
    the end and on a signal)."""
    logger = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
              "init_args": {"save_dir": str(directory), "name": "", "version": ""}}
    settings = [f"--seed_everything={seed}", f"--data.seed={seed}", f"--trainer.default_root_dir={directory}",
                f"--trainer.logger={json.dumps(logger)}", "--trainer.enable_checkpointing=true"]
    if eval_responses:
        settings.append('--trainer.callbacks+={"class_path": "evolrl.callbacks.EvalResponses"}')
    if checkpoint_every:
        saver = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"every_n_train_steps": checkpoint_every, "save_last": True, "save_top_k": 0}}
        settings.append(f"--trainer.callbacks+={json.dumps(saver)}")
    return settings


def class_names(config: dict, key: str = "callbacks") -> list[str]:
    """The class names of the trainer's ``key`` list in a resolved configuration."""
    items = (config.get("trainer") or {}).get(key) or []
    return [item["class_path"].rsplit(".", 1)[-1] for item in items if isinstance(item, dict) and "class_path" in item]


def flat(config, prefix: str = "") -> dict[str, object]:
    """``{dotted.key: value}`` over nested dicts; a list is one value (compared whole)."""
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, object] = {}
    for key, value in config.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def changes(old: dict, new: dict) -> list[str]:
    """``key: old -> new`` for each setting that differs (``(absent)`` where one side lacks it)."""
    a, b = flat(old), flat(new)
    missing = "(absent)"
    return [f"{key}: {json.dumps(a.get(key, missing))} -> {json.dumps(b.get(key, missing))}"
            for key in sorted(a.keys() | b.keys()) if a.get(key, missing) != b.get(key, missing)]
