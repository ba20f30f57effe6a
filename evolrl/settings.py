"""Checking settings where they are declared.

Every class that takes settings checks them in its ``__init__`` (or a dataclass's
``__post_init__``) with these helpers, so an out-of-range value fails when the object is built
(for a config, when ``python -m evolrl`` instantiates it, before any model is loaded) with the
setting's name, its value and what is allowed. The CLI prints a :class:`SettingError` as a
usage error instead of a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any


class SettingError(ValueError):
    """A setting has a value outside what its owner accepts."""


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise :class:`SettingError` naming ``key``, ``value`` and ``allowed`` unless ``ok``."""
    if not ok:
        raise SettingError(f"{key}={value!r} is not allowed: {allowed}")


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None) -> None:
    """``value`` is an integer (not a bool) within ``[low, high]`` (either bound may be open-ended)."""
    bounds = _bounds(low, high, left="[", right="]")
    require(isinstance(value, int) and not isinstance(value, bool), key, value, allowed=f"an integer {bounds}".rstrip())
    require((low is None or value >= low) and (high is None or value <= high), key, value,
            allowed=f"an integer {bounds}")


def check_float(key: str, value: Any, low: float | None = None, high: float | None = None,
                low_open: bool = False, high_open: bool = False) -> None:
    """``value`` is a finite number within the bounds (closed unless ``*_open``)."""
    bounds = _bounds(low, high, left="(" if low_open else "[", right=")" if high_open else "]")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    require(number and math.isfinite(value), key, value, allowed=f"a finite number {bounds}".rstrip())
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or (value < high if high_open else value <= high)
    require(above and below, key, value, allowed=f"a number {bounds}")


def check_choice(key: str, value: Any, choices: Collection[Any]) -> None:
    """``value`` is one of ``choices``."""
    require(value in choices, key, value, allowed="one of " + ", ".join(repr(c) for c in choices))


def _bounds(low, high, left: str, right: str) -> str:
    if low is None and high is None:
        return ""
    if high is None:
        return f"{'>' if left == '(' else '>='} {low}"
    if low is None:
        return f"{'<' if right == ')' else '<='} {high}"
    return f"in {left}{low}, {high}{right}"
