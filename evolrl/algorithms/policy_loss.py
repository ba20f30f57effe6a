"""Policy-gradient surrogates, each a class chosen by ``class_path`` (``model.loss.policy_loss``).

A surrogate turns the sampled tokens' log-probs under the current and the pre-update policy and the advantages into a
per-token loss ``[N, L]``, plus boolean masks of where each clip acted (the ``*_frac`` metrics). Aggregating the
per-token loss is the loss's job (``evolrl.algorithms.aggregation``), never the surrogate's.

* :class:`ClippedSurrogate`: PPO's clipped ratio with asymmetric and dual clipping (docs/method.md, section 1.6).
* :class:`GSPO`: the clipped surrogate on the sequence's ratio, the geometric mean of its tokens' ratios (GSPO-token;
  section 1.6a).
* :class:`CISPO`: every token's gradient weighted by its clipped, detached ratio, none zeroed (section 1.6b).
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


@dataclass(frozen=True)
class GSPO(PolicyLoss):
    """Group Sequence Policy Optimization, its GSPO-token form (Zheng et al. 2025, "Group Sequence Policy
    Optimization").

    The sequence's ratio ``s_i = exp(mean over its response tokens of (logp - old_logp))`` replaces the token's:
    ``L = max(-A s, -A clip(s, 1 - clip_low, 1 + clip_high))`` per token, the clip decided for the whole sequence.
    Each token's ``s`` is ``exp(sg(log s_i) + logp - sg(logp))``: its value is ``s_i`` and its derivative in the
    token's own ``logp`` is ``s_i``, so an unclipped token's gradient is ``-A s_i`` and a clipped sequence's tokens
    get none. GSPO's objective averages each sequence's tokens, then the sequences: pair it with
    :class:`~evolrl.algorithms.SeqMeanTokenMean` (``configs/gspo.yaml``).

    Masks: ``clip_low`` (``s < 1 - clip_low`` with ``A < 0``) and ``clip_high`` (``s > 1 + clip_high`` with
    ``A > 0``), on response tokens only.
    """

    clip_low: float = 3e-4
    """Lower clip range on the sequence ratio, ``1 - clip_low`` (the paper's 3e-4: sequence ratios stay near 1)."""
    clip_high: float = 4e-4
    """Upper clip range on the sequence ratio, ``1 + clip_high`` (the paper's 4e-4)."""

    def __post_init__(self) -> None:
        check_float("GSPO.clip_low", self.clip_low, low=0.0, high=1.0, low_open=True, high_open=True)
        check_float("GSPO.clip_high", self.clip_high, 0.0, low_open=True)

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mask.bool()
        delta = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
        log_s = delta.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
        ratio = torch.exp(log_s.detach() + logp - logp.detach())  # value s_i, d/d logp_t = s_i
        advantages = advantages.expand_as(ratio)
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        loss = torch.maximum(unclipped, clipped)
        s = ratio.detach()
        masks = {
            "clip_low": (s < 1.0 - self.clip_low) & (advantages < 0) & mask,
            "clip_high": (s > 1.0 + self.clip_high) & (advantages > 0) & mask,
        }
        return loss, masks


@dataclass(frozen=True)
class CISPO(PolicyLoss):
    """Clipped IS-weight Policy Optimization (MiniMax-M1 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently
    with Lightning Attention").

    Each token's gradient is ``-A sg(clip(r, 1 - clip_low, 1 + clip_high))`` in its own ``logp``, with
    ``r = exp(logp - old_logp)``: the clip bounds the weight, it never zeroes a token's gradient (PPO's clip drops
    the tokens it clips, often the rare ones that matter most). The per-token value is
    ``-A sg(clip(r)) exp(logp - sg(logp))``, the clipped weighted advantage, comparable with the PPO surrogate's.

    ``clip_low >= 1`` leaves the weight without a lower bound (the default: MiniMax-M1 tunes only the upper one). The
    cap is ``1 + clip_high``: the default 4.0 caps the weight at 5, ScaleRL's (Khatri et al. 2025) recommended
    epsilon_max (TRL's CISPO takes its ``epsilon_high`` as the cap itself, 5.0; ours is ``1 + clip_high``).

    Masks, whatever the advantage's sign (the clip acts on the weight): ``clip_high`` (``r > 1 + clip_high``) and,
    with a lower bound only, ``clip_low`` (``r < 1 - clip_low``), on response tokens only.
    """

    clip_low: float = 1.0
    """Lower clip range, ``1 - clip_low``; 1 or more: no lower bound (the default)."""
    clip_high: float = 4.0
    """Upper clip range: the weight is capped at ``1 + clip_high`` (default 5, ScaleRL's epsilon_max)."""

    def __post_init__(self) -> None:
        check_float("CISPO.clip_low", self.clip_low, 0.0)
        check_float("CISPO.clip_high", self.clip_high, 0.0, low_open=True)

    def __call__(self, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mask.bool()
        ratio = torch.exp(logp - old_logp).detach()
        low = 1.0 - self.clip_low if self.clip_low < 1.0 else None
        weight = ratio.clamp(low, 1.0 + self.clip_high)
        loss = -advantages * weight * torch.exp(logp - logp.detach())  # value -A clip(r), gradient -A clip(r)
        masks = {"clip_high": (ratio > 1.0 + self.clip_high) & mask}
        if low is not None:
            masks["clip_low"] = (ratio < low) & mask
        return loss, masks


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
