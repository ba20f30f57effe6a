"""pass@k and maj@k as ``torchmetrics`` metrics, for any LightningModule or plain loop.

``update(answers, correct, ids=None)`` takes one batch: per problem the ``n`` extracted answers
and whether each is correct (``[problems][n]``), and optionally the problems' ids. The value of
each problem is computed right there with the exact functions (:func:`~evolrl.metrics.pass_at_k`,
:func:`~evolrl.metrics.maj_at_k`), so the states are small tensors, one row per problem:

* ``problem_ids``: int64, a stable 63-bit hash of each id (:func:`problem_key`), ``-1`` without ids;
* ``samples``: int64, the ``n`` of each problem;
* ``values``: float64 ``[problems, ks]``, the per-problem pass@k / maj@k.

All three are list states with ``dist_reduce_fx="cat"``: torchmetrics gathers them from every rank
in ``compute()``, which then counts each problem id once (the first row, in rank order). Lightning's
distributed sampler repeats problems to give every rank the same number of batches; those repeats
are not counted twice. Problems without ids are all counted.

Use :class:`PassAtKMetric` / :class:`MajAtKMetric` (one k, a scalar: ``self.log(name, metric)``), or
:class:`EvalMetrics` (several ks at once: ``compute()`` returns a dict).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors

from evolrl.metrics.majk import maj_at_k
from evolrl.metrics.passk import pass_at_k
from evolrl.settings import check_int, require

NO_ID = -1
"""``problem_ids`` value of a problem given without an id: never merged with another."""


def problem_key(problem_id: Hashable) -> int:
    """A problem id as a non-negative int64, equal in every process (blake2b of ``str(id)``).

    Python's ``hash`` of a string is salted per process, so two ranks would disagree.
    """
    digest = hashlib.blake2b(str(problem_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def check_ks(key: str, ks: Any, allow_empty: bool = False) -> tuple[int, ...]:
    """``ks`` as a tuple of distinct integers >= 1 (in the given order); a :class:`SettingError` otherwise."""
    allowed = "a list of integers >= 1" if allow_empty else "a non-empty list of integers >= 1"
    require(isinstance(ks, Sequence) and not isinstance(ks, str), key, ks, allowed=allowed)
    require(allow_empty or len(ks) > 0, key, ks, allowed=allowed)
    for k in ks:
        require(isinstance(k, int) and not isinstance(k, bool) and k >= 1, key, ks, allowed=allowed)
    return tuple(dict.fromkeys(ks))


def counted_once(ids: Tensor) -> Tensor:
    """Boolean mask of the rows to count: every row without an id (``< 0``) and the first row of each id."""
    keep = ids < 0
    named = (~keep).nonzero().squeeze(1)
    if len(named):
        unique, inverse = torch.unique(ids[named], return_inverse=True)
        first = torch.full((len(unique),), len(ids), dtype=torch.long, device=ids.device)
        keep[first.scatter_reduce(0, inverse, named, reduce="amin")] = True
    return keep


class _ProblemMetric(Metric):
    """Per-problem pass@k / maj@k rows, gathered across ranks and counted once per problem id."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    problem_ids: list[Tensor] | Tensor
    samples: list[Tensor] | Tensor
    values: list[Tensor] | Tensor

    def __init__(self, pass_ks: tuple[int, ...], maj_ks: tuple[int, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pass_ks = pass_ks
        self.maj_ks = maj_ks
        self.add_state("problem_ids", default=[], dist_reduce_fx="cat")
        self.add_state("samples", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")

    @property
    def names(self) -> tuple[str, ...]:
        """The column names of ``values``: ``pass@k`` for each pass k, then ``maj@k``."""
        return (*(f"pass@{k}" for k in self.pass_ks), *(f"maj@{k}" for k in self.maj_ks))

    def update(self, answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]],
               ids: Sequence[Hashable] | None = None) -> None:
        """One batch: ``answers`` and ``correct`` are ``[problems][n]``, ``ids`` ``[problems]``."""
        if len(answers) != len(correct):
            raise ValueError(f"{type(self).__name__}: {len(answers)} problems of answers but {len(correct)} of "
                             "correctness flags")
        if ids is not None and len(ids) != len(answers):
            raise ValueError(f"{type(self).__name__}: {len(ids)} ids for {len(answers)} problems")
        need = max((*self.pass_ks, *self.maj_ks))
        keys, sizes, rows = [], [], []
        for i, (a, c) in enumerate(zip(answers, correct)):
            n = len(a)
            name = repr(ids[i]) if ids is not None else f"#{i} of the batch"
            if len(c) != n:
                raise ValueError(f"{type(self).__name__}: problem {name} has {n} answers but {len(c)} flags")
            if n < need:
                raise ValueError(f"{type(self).__name__}: {', '.join(self.names)} need at least {need} samples per "
                                 f"problem, but problem {name} has {n}")
            flags = [bool(x) for x in c]
            rows.append([pass_at_k(n, sum(flags), k) for k in self.pass_ks]
                        + [maj_at_k(a, flags, k) for k in self.maj_ks])
            keys.append(problem_key(ids[i]) if ids is not None else NO_ID)
            sizes.append(n)
        if not rows:
            return
        self.problem_ids.append(torch.tensor(keys, dtype=torch.long, device=self.device))
        self.samples.append(torch.tensor(sizes, dtype=torch.long, device=self.device))
        self.values.append(torch.tensor(rows, dtype=torch.float64, device=self.device).reshape(len(rows), -1))

    def _counted(self) -> tuple[Tensor, Tensor]:
        """``(samples [m], values [m, ks])`` of the problems counted (each id once)."""
        if isinstance(self.problem_ids, list) and not self.problem_ids:
            return (torch.zeros(0, dtype=torch.long, device=self.device),
                    torch.zeros(0, len(self.names), dtype=torch.float64, device=self.device))
        keep = counted_once(dim_zero_cat(self.problem_ids))
        return dim_zero_cat(self.samples)[keep], dim_zero_cat(self.values)[keep]

    @staticmethod
    def _means(values: Tensor) -> Tensor:
        """Column means; NaN before any problem was seen."""
        return values.mean(0) if len(values) else torch.full(values.shape[1:], float("nan"), dtype=values.dtype,
                                                             device=values.device)

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Any = None) -> None:
        # A rank without a problem would send torchmetrics' float32 stand-in of shape [0] for every state;
        # send empty tensors of the real dtypes and shapes instead.
        empty = {"problem_ids": torch.zeros(0, dtype=torch.long), "samples": torch.zeros(0, dtype=torch.long),
                 "values": torch.zeros(0, len(self.names), dtype=torch.float64)}
        for attr, value in empty.items():
            if isinstance(getattr(self, attr), list) and not getattr(self, attr):
                setattr(self, attr, [value.to(self.device)])
        super()._sync_dist(dist_sync_fn, process_group)

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = ()) -> Metric:
        # nn.Module.to(dtype) (e.g. on a bf16 module) must not round the per-problem values: keep them float64.
        this = super()._apply(fn, exclude_state)
        values = getattr(this, "values", None)
        if isinstance(values, Tensor):
            this.values = values.double()
        elif values is not None:
            this.values = [s.double() for s in values]
        return this


class EvalMetrics(_ProblemMetric):
    """pass@k and maj@k for several k, averaged over the distinct problems seen.

    ``compute()`` returns ``{"pass@1": ..., "maj@16": ..., "problems": ..., "samples": ...}``: float64
    means, the number of problems counted and the fewest samples any of them had.

    Args:
        pass_ks: The k of pass@k (the unbiased estimator), each at most the samples per problem.
        maj_ks: The k of maj@k (exact expected majority-vote accuracy of k of the n samples).
        kwargs: torchmetrics' ``Metric`` options (``process_group``, ``sync_on_compute``, ...).
    """

    def __init__(self, pass_ks: Sequence[int] = (1,), maj_ks: Sequence[int] = (), **kwargs: Any) -> None:
        pass_ks = check_ks("EvalMetrics.pass_ks", pass_ks, allow_empty=True)
        maj_ks = check_ks("EvalMetrics.maj_ks", maj_ks, allow_empty=True)
        require(bool(pass_ks or maj_ks), "EvalMetrics.pass_ks", pass_ks, allowed="at least one k in pass_ks or maj_ks")
        super().__init__(pass_ks, maj_ks, **kwargs)

    def compute(self) -> dict[str, Tensor]:
        samples, values = self._counted()
        means = self._means(values)
        out = {name: means[j] for j, name in enumerate(self.names)}
        out["problems"] = torch.tensor(len(samples), device=self.device)
        out["samples"] = samples.min() if len(samples) else torch.tensor(0, device=self.device)
        return out


class PassAtKMetric(_ProblemMetric):
    """pass@k (unbiased estimator) averaged over the distinct problems seen; ``compute()`` is a scalar,
    so a LightningModule logs it with ``self.log(name, metric)``.

    Args:
        k: Samples per attempt, at most the samples per problem.
        kwargs: torchmetrics' ``Metric`` options.
    """

    def __init__(self, k: int = 1, **kwargs: Any) -> None:
        check_int("PassAtKMetric.k", k, 1)
        super().__init__((k,), (), **kwargs)
        self.k = k

    def compute(self) -> Tensor:
        return self._means(self._counted()[1])[0]


class MajAtKMetric(_ProblemMetric):
    """maj@k (exact expected accuracy of a majority vote over k of the n samples) averaged over the distinct
    problems seen; ``compute()`` is a scalar (``self.log(name, metric)``).

    Args:
        k: Samples per vote, at most the samples per problem.
        kwargs: torchmetrics' ``Metric`` options.
    """

    def __init__(self, k: int = 1, **kwargs: Any) -> None:
        check_int("MajAtKMetric.k", k, 1)
        super().__init__((), (k,), **kwargs)
        self.k = k

    def compute(self) -> Tensor:
        return self._means(self._counted()[1])[0]
