"""Policy-gradient surrogates, each a class chosen by ``class_path`` (``model.loss.policy_loss``).

A surrogate turns the sampled tokens' log-probs under the current and the pre-update policy and the advantages into a
per-token loss ``[N, L]``, plus boolean masks of where each clip acted (the ``*_frac`` metrics). Aggregating the
per-token loss is the loss's job (``evolrl.algorithms.aggregation``), never the surrogate's.

* :class:`ClippedSurrogate`: PPO's clipped ratio with asymmetric and dual clipping (docs/method.md, section 1.6).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.settings import check_float


class PolicyLoss(ABC):
    """``loss(logp, old_logp, advantages, mask) -> (per_token_loss [N, L], masks)``.

    ``logp``, ``old_logp`` and ``mask`` are ``[N, L]``; ``advantages`` is ``[N, 1]`` (one per sequence) or ``[N, L]``;
    ``masks`` maps a clip's name to a bool ``[N, L]`` of where it acted. Not a dataclass itself, so that the CLI
    takes any subclass by ``class_path``; the subclasses are frozen dataclasses checked in ``__post_init__``.
    """

    @abstractmethod
    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The per-token loss and the clip masks."""


@dataclass(frozen=True)
class ClippedSurrogate(PolicyLoss):
    """PPO's clipped surrogate with EVOL-RL's asymmetric clip and a dual clip (the default)."""

    clip_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - clip_low``."""
    clip_high: float = 0.28
    """Upper clip range, ``1 + clip_high`` (EVOL-RL's asymmetric clip; TTRL 0.2)."""
    dual_clip: float | None = 3.0
    """Cap on the loss of a negative-advantage token, ``-A * dual_clip``; ``null`` turns it off."""

    def __post_init__(self) -> None:
        check_float("ClippedSurrogate.clip_low", self.clip_low, low=0.0, high=1.0, high_open=True)
        check_float("ClippedSurrogate.clip_high", self.clip_high, 0.0)
        if self.dual_clip is not None:
            check_float("ClippedSurrogate.dual_clip", self.dual_clip, 1.0, low_open=True)

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        return clipped_surrogate(logp, old_logp, advantages=advantages, clip_low=self.clip_low,
                                 clip_high=self.clip_high, dual_clip=self.dual_clip)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss ``[N, L]`` and boolean masks of where each clip was active.

    ``ratio = exp(logp - old_logp)``;
    ``L = max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` also
    ``L = min(L, -A dual_clip)`` (dual clip; ``None`` turns it off).

    Args:
        logp, old_logp: ``[N, L]`` log-probs of the sampled tokens under the current and the
            pre-update policy.
        advantages: ``[N, L]``, or ``[N, 1]`` to broadcast one advantage per sequence.

    Returns:
        ``(loss, masks)`` with masks ``clip_low`` (ratio below ``1 - clip_low`` with ``A < 0``),
        ``clip_high`` (ratio above ``1 + clip_high`` with ``A > 0``) and ``dual_clip``.
    """
    ratio = torch.exp(logp - old_logp)
    advantages = advantages.expand_as(ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    masks = {
        "clip_low": (ratio < 1.0 - clip_low) & (advantages < 0),
        "clip_high": (ratio > 1.0 + clip_high) & (advantages > 0),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip={dual_clip} must be greater than 1 (or None to turn it off)")
        bound = -advantages * dual_clip
        masks["dual_clip"] = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, masks
