"""pass@k from n samples with c correct.

:func:`pass_at_k` is the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` of the
chance that at least one of k samples drawn without replacement is correct.
The EVOL-RL authors reported k samples drawn *with* replacement,
``1 - (1 - c/n)^k``, which is biased low (c = 1 of n = 32 gives 0.40 at k = 16
instead of 0.50); compare with the paper's tables with that in mind.
"""

from __future__ import annotations

from math import comb


def _check(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (exact integer arithmetic, one rounding at the end)."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)
