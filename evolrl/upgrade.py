"""Configuration keys that moved, and the error that names the new key.

A config written for an earlier layout would otherwise stop with jsonargparse's "key not expected", which does not
say where the setting went. :func:`moved_keys` reads the ``--config`` files and ``--key=value`` arguments of a command
line before it is parsed; the CLI reports every moved key it finds as a usage error, pointing here for the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ANSWER_RULES = ("valid_rule", "number_fallback", "fallback_rule")
MOVED: dict[str, str] = {
    "model.loss.clip_low": "model.loss.policy_loss.init_args.clip_low",
    "model.loss.clip_high": "model.loss.policy_loss.init_args.clip_high",
    "model.loss.dual_clip": "model.loss.policy_loss.init_args.dual_clip",
    "model.loss.scale_by_std": "model.advantages.scale_by_std",
    **{f"model.reward.{rule}": f"model.reward.init_args.answers.{rule}" for rule in ANSWER_RULES},
    **{f"data.eval_sets.*.grader.{rule}": f"data.eval_sets.*.init_args.grader.init_args.answers.{rule}"
       for rule in ANSWER_RULES[1:]},
    "data.system_prompt": "data.prompt.system",
    "data.examples": "data.prompt.examples",
    "data.max_prompt_tokens": "data.prompt.max_tokens",
}
"""Old key -> new key. ``*`` stands for a list index; ``init_args`` levels are optional in the old key."""


def moved_keys(args: Sequence[str]) -> list[tuple[str, str]]:
    """``(old key as written, new key)`` for every moved key in ``args``'s config files and dotted arguments."""
    found = []
    for key in _keys(args):
        plain = re.sub(r"\.(\d+)(?=\.)", ".*", key.replace(".init_args.", "."))
        if plain in MOVED:
            found.append((key, MOVED[plain]))
    return found


def _keys(args: Sequence[str]) -> Iterator[str]:
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            yield from _config_keys(args[i + 1])
        elif arg.startswith("--config="):
            yield from _config_keys(arg.split("=", 1)[1])
        elif arg.startswith("--") and "." in arg:
            yield arg[2:].split("=", 1)[0]


def _config_keys(path: str) -> Iterator[str]:
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return  # not readable here: jsonargparse reports it
    yield from _flatten(config, "")


def _flatten(value: Any, prefix: str) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}{key}"
            yield path
            yield from _flatten(inner, path + ".")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _flatten(inner, f"{prefix}{index}.")
