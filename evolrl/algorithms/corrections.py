"""Importance weights for the sampler/trainer mismatch, each a class chosen by ``class_path``
(``model.loss.mismatch_correction``).

Per response token t, ``delta_t = old_logp_t - sampler_logp_t`` (``evolrl/algorithms/mismatch.py``): ``exp(delta_t)``
is the importance ratio trainer / sampler of that token. Each correction turns ``delta`` into a weight on the
per-token policy-gradient loss (never on the KL or the entropy term, as in both sources), detached, with the loss
normalizer unchanged (a masked token still counts in it, weighted 0):

* :class:`TokenTruncate`, token-level truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training"; verl's ``rollout_is: token``, decoupled mode, default threshold 2.0):
  ``w_t = min(exp(delta_t), cap)``. Where ours differs from verl: no safety clamp of ``delta`` to +-20 before ``exp``
  (the cap bounds the weight from above, and a weight that underflows to 0 is the right limit) and no option to
  renormalize the weights to mean 1 over the batch.
* :class:`SequenceMask`, TRL 1.16's ``vllm_importance_sampling_mode="sequence_mask"`` (its default, with
  ``vllm_importance_sampling_clip_max=3.0`` and no lower bound): one ratio per sequence, the product of its token
  ratios ``rho = exp(sum_t delta_t)``; the sequence's weight is ``rho`` when ``low <= rho <= high`` and 0 otherwise,
  on every one of its tokens. Where ours differs from TRL: ``low`` is a number (0, TRL's ``None``, is the default),
  and no token's ``delta`` is NaN (TRL zeroes NaN log-probs from vLLM; evolrl's engines report every token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from evolrl.settings import check_float


class MismatchCorrection(ABC):
    """A weight per response token from ``delta = old - sampler`` log-probs, and what it reports per step.

    Not a dataclass itself, so that the CLI takes any subclass by ``class_path``; the subclasses are frozen
    dataclasses whose fields are their settings, checked in ``__post_init__``.
    """

    name: ClassVar[str]
    """Short name, in the diagnostics' descriptions and the tools' tables."""

    @abstractmethod
    def weights(self, delta: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``(weights, hit)`` for ``delta [N, L]`` at the response tokens in ``mask [N, L]``: the weights broadcast
        to ``[N, L]``; ``hit [N, L]`` marks the response tokens the correction changed (truncated or masked)."""

    @abstractmethod
    def hit_fractions(self, tokens: float, sequences: float, hit_tokens: float,
                      hit_sequences: float) -> dict[str, float]:
        """The per-step shares of what was hit (``mismatch/<key>``), from counts summed over passes and ranks."""


@dataclass(frozen=True)
class TokenTruncate(MismatchCorrection):
    """Token-level truncated importance sampling (verl, Yao et al. 2025).

    Each response token's weight is ``min(exp(old - sampler), cap)``. Logs ``mismatch/truncated_token_frac``.
    """

    name: ClassVar[str] = "token_truncate"
    cap: float = 2.0
    """The largest token weight (verl's default threshold, 2.0); at least 1."""

    def __post_init__(self) -> None:
        check_float("TokenTruncate.cap", self.cap, 1.0)

    def weights(self, delta: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        # Outside ``mask`` the weight is 1 and nothing is truncated (those positions are not in the loss).
        ratio = torch.where(mask, delta, 0.0).exp()
        return ratio.clamp(max=self.cap), mask & (ratio > self.cap)

    def hit_fractions(self, tokens: float, sequences: float, hit_tokens: float,
                      hit_sequences: float) -> dict[str, float]:
        return {"truncated_token_frac": hit_tokens / tokens}


@dataclass(frozen=True)
class SequenceMask(MismatchCorrection):
    """Sequence-level importance weights, masked outside bounds (TRL 1.16's default estimator).

    Every token of a sequence gets the sequence's ``rho = exp(sum of old - sampler)``, or 0 when ``rho`` is outside
    ``[low, high]``. Logs ``mismatch/masked_seq_frac`` and ``masked_token_frac``.
    """

    name: ClassVar[str] = "sequence_mask"
    low: float = 0.0
    """A sequence whose ratio is below this is masked; in [0, 1) (0: no lower bound, TRL's default)."""
    high: float = 3.0
    """A sequence whose ratio is above this is masked; finite and above 1 (TRL's default, 3.0)."""

    def __post_init__(self) -> None:
        check_float("SequenceMask.low", self.low, low=0.0, high=1.0, high_open=True)
        check_float("SequenceMask.high", self.high, 1.0, low_open=True)

    def weights(self, delta: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        # A sequence without tokens in ``mask`` has rho = 1: kept (and it contributes nothing anyway). An overflow of
        # rho to inf is above any bound: masked.
        rho = torch.where(mask, delta, 0.0).sum(-1).exp()  # [N]
        masked = (rho < self.low) | (rho > self.high)
        return torch.where(masked, 0.0, rho)[:, None], mask & masked[:, None]

    def hit_fractions(self, tokens: float, sequences: float, hit_tokens: float,
                      hit_sequences: float) -> dict[str, float]:
        return {"masked_seq_frac": hit_sequences / sequences, "masked_token_frac": hit_tokens / tokens}
