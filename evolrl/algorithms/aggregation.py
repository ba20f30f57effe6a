"""Reducing per-token losses to one number, independently of how the batch is split.

Each way is a class chosen by ``class_path`` (``model.loss.aggregation``):

* :class:`TokenMean`: sum over every response token of the mini-batch / number of those tokens.
* :class:`SeqMeanTokenMean` (the paper's equation 1): mean over sequences of each sequence's token mean.
* :class:`ConstantNormalizer` (Dr. GRPO): sum over every response token / (sequences x the response budget
  ``max_new_tokens``), a divisor that does not depend on the responses' lengths.

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
    def normalizer(self, mask: Tensor, max_new_tokens: int | None = None) -> Tensor:
        """What the sum is divided by, counted in ``mask [N, L]`` (the whole mini-batch's); ``max_new_tokens`` is
        the response budget the responses were sampled with (``sampling.max_new_tokens``), for a way that needs it."""

    @abstractmethod
    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None) -> Tensor:
        """Masked reduction of ``values [N, L]`` over the response tokens in ``mask [N, L]``, divided by
        ``normalizer`` (the mini-batch's :meth:`normalizer`; ``None``: this batch's own)."""


@dataclass(frozen=True)
class TokenMean(Aggregation):
    """Token mean over the mini-batch (the default, as in the authors' code).

    The sum over every response token of the mini-batch / the number of those tokens.
    """

    def normalizer(self, mask: Tensor, max_new_tokens: int | None = None) -> Tensor:
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

    def normalizer(self, mask: Tensor, max_new_tokens: int | None = None) -> Tensor:
        return torch.tensor(mask.shape[0], device=mask.device)

    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None) -> Tensor:
        mask = mask.to(values.dtype)
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / (normalizer if normalizer is not None else values.shape[0])


@dataclass(frozen=True)
class ConstantNormalizer(Aggregation):
    """Dr. GRPO's sum over a constant (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective").

    The sum over every response token of the mini-batch / (the mini-batch's sequences x ``max_new_tokens``, the
    response budget they were sampled with; not the mask's width, which follows the longest response). Neither a
    response's own length nor the mini-batch's token count divides its tokens' losses: every token weighs the same
    in every mini-batch (docs/method.md, section 1.9a). The budget is not a setting: :meth:`normalizer` takes it
    from the step's sampling settings.
    """

    def normalizer(self, mask: Tensor, max_new_tokens: int | None = None) -> Tensor:
        if max_new_tokens is None:
            raise ValueError("ConstantNormalizer divides by sequences x max_new_tokens: pass max_new_tokens, the "
                             "response budget the responses were sampled with (sampling.max_new_tokens); it is None")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"ConstantNormalizer: max_new_tokens={max_new_tokens!r} must be a positive integer")
        return torch.tensor(float(mask.shape[0] * max_new_tokens), device=mask.device)

    def __call__(self, values: Tensor, mask: Tensor, normalizer: Tensor | float | None = None,
                 max_new_tokens: int | None = None) -> Tensor:
        """As :meth:`Aggregation.__call__`; without a ``normalizer`` this batch's own needs ``max_new_tokens``."""
        if normalizer is None:
            if max_new_tokens is None:
                raise ValueError("ConstantNormalizer cannot count its own divisor without the response budget: pass "
                                 "normalizer (its normalizer(mask, max_new_tokens)) or max_new_tokens; both are None")
            normalizer = self.normalizer(mask, max_new_tokens)
        return (values * mask.to(values.dtype)).sum() / normalizer
