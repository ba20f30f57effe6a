"""Group-relative advantages (GRPO)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.settings import require


@dataclass(frozen=True)
class GroupAdvantages:
    """How a group's rewards become advantages (``model.advantages``)."""

    scale_by_std: bool = True
    """Divide by the group's reward std (GRPO); ``false`` keeps ``r - mean`` (Dr. GRPO)."""

    def __post_init__(self) -> None:
        require(isinstance(self.scale_by_std, bool), "GroupAdvantages.scale_by_std", self.scale_by_std,
                allowed="true or false")

    def __call__(self, rewards: Tensor) -> Tensor:
        """``[P, G]`` rewards to ``[P, G]`` advantages (:func:`group_advantages`)."""
        return group_advantages(rewards, self.scale_by_std)


def group_advantages(rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """``A = (r - mean) / (std + eps)`` inside each group, ``[P, G] -> [P, G]``.

    ``std`` uses the ``G - 1`` denominator (as verl and the authors do). Equal rewards
    give ``A = 0``; so does a group of one. ``scale_by_std=False`` is the "Dr. GRPO"
    variant, ``A = r - mean``.
    """
    rewards = rewards.float()
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale_by_std:
        return centered
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    return centered / (rewards.std(dim=-1, keepdim=True) + eps)


def agreeing_groups(rewards: Tensor) -> Tensor:
    """``[P, G]`` rewards to ``[P]`` bool: the groups whose rewards all agree. Their advantages are all zero, so they
    train nothing through the policy gradient (dynamic sampling drops them)."""
    return (rewards == rewards[:, :1]).all(dim=-1)
