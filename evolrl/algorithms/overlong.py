"""Overlong shaping (DAPO, Yu et al. 2025): what a response near or at the token limit gets, for any reward.

Each mode is a class chosen by ``class_path`` (``model.overlong``; ``null``, the default, is neither):

* :class:`OverlongPenalty`: DAPO's soft overlong punishment, added to every response's reward before the vote-free
  parts of the step (advantages, dynamic sampling) see it;
* :class:`OverlongMask`: DAPO's overlong filtering, truncated responses left out of the loss.

Lengths count response tokens, the stop token included; ``max_new_tokens`` is the budget the responses were sampled
with (``RolloutBatch.max_new_tokens``).
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.settings import check_float, check_int, require


class Overlong(ABC):
    """A way to treat long responses (each mode overrides what it does); not a dataclass itself, so that the CLI
    takes any subclass by ``class_path``."""

    def check(self, max_new_tokens: int) -> None:
        """Refuse settings that do not fit the sampling budget (run at start, and on every step's budget)."""

    def penalty(self, lengths: Tensor, truncated: Tensor, max_new_tokens: int) -> Tensor | None:
        """``[P, V]`` added to the rewards of responses of ``lengths`` and ``truncated`` ``[P, V]``; ``None``: none."""
        return None

    def masks(self) -> bool:
        """Whether truncated responses are left out of the loss."""
        return False


@dataclass(frozen=True)
class OverlongPenalty(Overlong):
    """A penalty falling linearly from 0 at ``max_new_tokens - buffer`` tokens to ``-factor`` at ``max_new_tokens``;
    a truncated response (at the limit) gets the whole ``-factor``."""

    buffer: int | None = None
    """Tokens before the limit where the penalty grows (DAPO: 4,096 of 20,480); ``null``: a fifth of the budget."""
    factor: float = 1.0
    """The penalty at the limit, in reward units."""

    def __post_init__(self) -> None:
        if self.buffer is not None:
            check_int("OverlongPenalty.buffer", self.buffer, 1)
        check_float("OverlongPenalty.factor", self.factor, 0.0, low_open=True)

    def window(self, max_new_tokens: int) -> int:
        """The buffer for a budget of ``max_new_tokens``."""
        return self.buffer if self.buffer is not None else max(1, max_new_tokens // 5)

    def check(self, max_new_tokens: int) -> None:
        require(self.window(max_new_tokens) < max_new_tokens, "model.overlong.init_args.buffer", self.buffer,
                allowed=f"fewer tokens than data.sampling.max_new_tokens={max_new_tokens} (the penalty starts "
                "buffer tokens before the limit)")

    def penalty(self, lengths: Tensor, truncated: Tensor, max_new_tokens: int) -> Tensor:
        buffer = self.window(max_new_tokens)
        over = (lengths.float() - (max_new_tokens - buffer)).clamp(0, buffer) / buffer
        return -self.factor * torch.where(truncated, torch.ones_like(over), over)


@dataclass(frozen=True)
class OverlongMask(Overlong):
    """Truncated responses are left out of the loss (their tokens count neither in a term nor in its normalizer);
    their rewards still count in the vote and in their group's advantages."""

    def masks(self) -> bool:
        return True

