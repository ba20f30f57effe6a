"""maj@k: the expected accuracy of a majority vote over k of the n samples.

:func:`maj_at_k` is exact. The k samples are a uniformly random draw without
replacement, taken in random order; the vote is the rewards' own
(:func:`~evolrl.rewards.group_answers`, then :func:`~evolrl.rewards.majority_class`:
equivalence classes, missing answers never win, ties to the answer seen first),
so a tie is won by each tied answer with equal chance.

The computation is a generating function over equivalence classes. With class
sizes ``n_i``, the draw picks ``x_i`` of class ``i`` with probability
``prod_i C(n_i, x_i) / C(n, k)``. Class ``j`` wins with count ``t`` when every
other class has at most ``t``; if ``s`` others tie at ``t`` it wins with chance
``1 / (s + 1)``. For each ``t`` we multiply, over the other classes, the
polynomials ``sum_{x<t} C(n_i, x) z^x + y C(n_i, t) z^t`` (``y`` counts ties)
and read the coefficient of ``z^(k-t)``. Classes of equal size share one
factor, so the work is small for the usual n = 32 or 64.

The authors resampled k answers *with* replacement instead; evolrl does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from math import comb

import numpy as np

from evolrl.rewards.voting import class_counts, group_answers


def _classes(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[list[int | None], list[bool]]:
    if len(answers) != len(correct):
        raise ValueError(f"got {len(answers)} answers but {len(correct)} correctness flags")
    classes = group_answers(answers)
    num = max((c for c in classes if c is not None), default=-1) + 1
    class_correct = [bool(correct[classes.index(c)]) for c in range(num)]  # judged by its first member
    return classes, class_correct


def _times(poly: np.ndarray, low: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """``poly * (low(z) + y tie(z))`` truncated to the shape of ``poly`` ``[z degree, y degree]``."""
    deg = poly.shape[0]
    low_m = np.zeros((deg, deg))
    tie_m = np.zeros((deg, deg))
    for d in range(min(len(low), deg)):
        low_m += np.eye(deg, k=-d) * low[d]
    for d in range(min(len(tie), deg)):
        tie_m += np.eye(deg, k=-d) * tie[d]
    out = low_m @ poly
    out[:, 1:] += (tie_m @ poly)[:, :-1]
    return out


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """Exact expected majority-vote accuracy of ``k`` samples drawn without replacement.

    Args:
        answers: The n extracted answers of one problem (``None`` for no answer).
        correct: Per answer, whether it is correct; a class is as correct as its first member.
        k: Samples per vote, ``1 <= k <= n``.
    """
    n = len(answers)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    classes, class_correct = _classes(answers, correct)
    sizes = class_counts(classes)  # class -> size
    n_none = n - sum(sizes.values())
    size_mult = Counter(sizes.values())  # size -> number of classes of that size
    correct_of_size = Counter(sizes[c] for c in sizes if class_correct[c])
    shape = (k + 1, len(sizes) + 1)  # z degree 0..k, y degree 0..(#classes)
    none_poly = np.zeros(shape)
    none_poly[: min(n_none, k) + 1, 0] = [comb(n_none, x) for x in range(min(n_none, k) + 1)]
    total = 0.0
    for t in range(1, k + 1):
        factors = {
            size: (np.array([comb(size, x) for x in range(min(t - 1, size) + 1)], float),
                   np.array([0.0] * t + [comb(size, t)]) if t <= size else np.zeros(1))
            for size in size_mult
        }
        for size, num_correct in correct_of_size.items():
            if size < t:
                continue
            poly = none_poly
            for other, mult in size_mult.items():
                for _ in range(mult - (other == size)):
                    poly = _times(poly, *factors[other])
            ties = poly[k - t]  # coefficient of z^(k-t), by number of other classes tied at t
            win = float(np.sum(ties / np.arange(1, len(ties) + 1)))
            total += num_correct * comb(size, t) * win
    return total / comb(n, k)
