"""Reducing per-token losses to one number, independently of how the batch is split.

Each way is a class chosen by ``class_path`` (``model.loss.aggregation``):

* :class:`TokenMean`: sum over every response token of the mini-batch / number of those tokens.
* :class:`SeqMeanTokenMean` (the paper's equation 1): mean over sequences of each sequence's token mean.

Gradient accumulation must not change the math, so the normalizer is the *mini-batch's* token (or sequence)
count, taken with :meth:`Aggregation.normalizer` before the micro-batch loop and passed to every micro-batch's
call: the micro-batch losses then sum to the mini-batch loss.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor


class Aggregation(ABC):
    """How per-token values ``[N, L]`` become one number: ``normalizer`` counts, ``__call__`` sums and divides.

    Not a dataclass itself, so that the CLI takes any subclass by ``class_path``; the subclasses are frozen
    dataclasses (compared by value, and printed by ``--print_config``).
    """

    @abstractmethod
    def normalizer(self, mask: Tensor) -> Tensor:
        """What the sum is divided by, counted in ``mask [N, L]`` (the whole mini-batch's)."""

    @abstractmethod
    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None) -> Tensor:
        """Masked reduction of ``values [N, L]`` over the response tokens in ``mask [N, L]``, divided by
        ``normalizer`` (the mini-batch's :meth:`normalizer`; ``None``: this batch's own)."""


@dataclass(frozen=True)
class TokenMean(Aggregation):
    """Token mean over the mini-batch (the default, as in the authors' code).

    The sum over every response token of the mini-batch / the number of those tokens.
    """

    def normalizer(self, mask: Tensor) -> Tensor:
        return mask.sum()

    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None) -> Tensor:
        mask = mask.to(values.dtype)
        total = (values * mask).sum()
        return total / (normalizer if normalizer is not None else mask.sum().clamp(min=1))


@dataclass(frozen=True)
class SeqMeanTokenMean(Aggregation):
    """Sequence mean of token means (the paper's equation 1).

    Each sequence's mean over its response tokens, then the mean over the mini-batch's sequences (a short response's
    tokens weigh more than a long one's).
    """

    def normalizer(self, mask: Tensor) -> Tensor:
        return torch.tensor(mask.shape[0], device=mask.device)

    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None) -> Tensor:
        mask = mask.to(values.dtype)
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / (normalizer if normalizer is not None else values.shape[0])
