"""Majority vote over one group's answers, with mathematical equivalence classes.

Answers are grouped into classes in order of first appearance: an answer joins
the first earlier class whose representative (its first member) it is
equivalent to. The majority label is the representative of the largest class;
a tie goes to the class seen first. Missing or empty answers belong to no class
and so never win.
"""

from __future__ import annotations

from collections.abc import Sequence

from evolrl.rewards.equivalence import normalize_answer, normalized_equivalent


def group_answers(answers: Sequence[str | None]) -> list[int | None]:
    """Class index per answer (``0, 1, ...`` in order of first appearance); ``None`` for no answer."""
    representatives: list[str] = []  # normalized first member of each class
    class_of_string: dict[str, int] = {}  # fast path: identical normalized strings
    classes: list[int | None] = []
    for answer in answers:
        key = normalize_answer(answer) if answer is not None else ""
        if not key:
            classes.append(None)
            continue
        if key not in class_of_string:
            match = next((c for c, rep in enumerate(representatives) if normalized_equivalent(key, rep)), None)
            if match is None:
                match = len(representatives)
                representatives.append(key)
            class_of_string[key] = match
        classes.append(class_of_string[key])
    return classes


def class_counts(classes: Sequence[int | None]) -> dict[int, int]:
    """Members per class of :func:`group_answers` output (or of an ``answer_class`` row, where -1 is no answer), in
    order of first appearance."""
    counts: dict[int, int] = {}
    for c in classes:
        if c is not None and c >= 0:
            counts[c] = counts.get(c, 0) + 1
    return counts


def majority_class(classes: Sequence[int | None]) -> int | None:
    """The winning class of :func:`group_answers` output: most members, ties to the first seen."""
    counts = class_counts(classes)
    return max(counts, key=lambda c: (counts[c], -c)) if counts else None
