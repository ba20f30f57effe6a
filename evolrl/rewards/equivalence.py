"""When are two final answers the same?

Two steps: a LaTeX clean-up (``normalize_answer``) that makes the common
surface variants identical strings, then, only for strings that still differ,
a mathematical comparison by `math-verify <https://github.com/huggingface/Math-Verify>`_
(sympy underneath). Plain numbers are compared exactly as decimals, which is
both faster and stricter than a float round-trip.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from math_verify import parse, verify

_SPACING = re.compile(r"\\[!,;:> ]|\\q?quad")
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\\circ|°|\\degree")
_UNITS = (
    "degrees?|cm|mm|km|m|meters?|centimeters?|kilometers?|inch(?:es)?|in|feet|foot|ft|yards?|miles?"
    "|units?|sq|square|cubic|dollars?|cents?|hours?|hrs?|minutes?|mins?|seconds?|secs?|days?|weeks?"
    "|years?|grams?|kg|g|pounds?|lbs?|liters?|mph|points?|people|students|ways"
)
_TRAILING_UNIT = re.compile(rf"^(-?\d[\d.,]*|\\frac\{{\d+\}}\{{\d+\}})\s+(?:{_UNITS})(?:\^\{{?[23]\}}?)?$")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)")
_FRAC_HALF_SHORT = re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d)|\\frac\s*(\d)\s*(\{[^{}]*\})")
_SQRT_SHORT = re.compile(r"\\sqrt\s*(\d)")
_ASSIGNMENT = re.compile(r"^[A-Za-z]\s*=\s*(?!=)")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _canonical_number(s: str) -> str | None:
    """``025`` -> ``25``, ``142.0`` -> ``142``, ``1,000`` -> ``1000``, ``.50`` -> ``0.5``; else ``None``."""
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    if not re.fullmatch(r"-?(?:\d+\.?\d*|\.\d+)", s):
        return None
    try:
        value = Decimal(s)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def normalize_answer(answer: str) -> str:
    """A canonical string for a final answer; equal strings mean equal answers.

    Removes what does not change the value: ``$``, spacing commands and spaces,
    ``\\left``/``\\right``, ``\\text{}`` wrappers, degree signs and trailing units,
    ``\\%``, a leading ``x =``, a trailing period. Rewrites ``\\dfrac``/``\\tfrac``
    to ``\\frac``, ``\\frac12`` to ``\\frac{1}{2}``, ``\\sqrt2`` to ``\\sqrt{2}``, and
    plain numbers to a canonical decimal (``025`` -> ``25``, ``142.0`` -> ``142``).
    """
    s = answer.strip().replace("\n", " ")
    s = s.replace("\\$", "").replace("$", "")
    s = _SPACING.sub(" ", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = _TEXT_COMMANDS.sub(r"\1", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    s = _ASSIGNMENT.sub("", s)
    unit = _TRAILING_UNIT.match(s)
    if unit:
        s = unit.group(1)
    s = s.replace(" ", "")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_SHORT.sub(
        lambda m: f"\\frac{m.group(1)}{{{m.group(2)}}}" if m.group(1) else f"\\frac{{{m.group(3)}}}{m.group(4)}", s
    )
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    number = _canonical_number(s)
    return number if number is not None else s


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=1 << 16)
def _parsed(normalized: str) -> tuple:
    return tuple(parse(f"${normalized}$", parsing_timeout=_timeout()))


@lru_cache(maxsize=1 << 16)
def _verified(a: str, b: str) -> bool:
    pa, pb = _parsed(a), _parsed(b)
    if not pa or not pb:
        return False
    return bool(verify(list(pa), list(pb), timeout_seconds=_timeout()))


def normalized_equivalent(a: str, b: str) -> bool:
    """:func:`answers_equivalent` for two strings that are already normalized."""
    if not a or not b:
        return False
    if a == b:
        return True
    if _canonical_number(a) is not None and _canonical_number(b) is not None:
        return False  # two different canonical decimals
    return _verified(a, b) if a <= b else _verified(b, a)


def answers_equivalent(a: str | None, b: str | None) -> bool:
    """Whether two final answers are mathematically the same (``\\frac12`` == ``0.5``).

    A missing or empty answer is equivalent to nothing, not even another empty one.
    """
    if a is None or b is None:
        return False
    return normalized_equivalent(normalize_answer(a), normalize_answer(b))
