"""Scoring a training step's rollouts: the reward of every response, then the trained sequences with advantages.

A reward that reads the policy (``reward.needs_policy``: self-certainty, token entropy) is given one no-grad pass of
the policy over the trained sequences (the ``policy_pass`` function, ``GRPOUpdate.policy_pass``), which the update
then reuses for its old log-probs; any other reward reads the responses only and no pass is made here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from evolrl.algorithms import GroupAdvantages
from evolrl.logprobs import Sequences, trained_sequences
from evolrl.rewards import Reward
from evolrl.rewards.policy_signal import PolicySignal
from evolrl.training.update import PolicyPass
from evolrl.types import RewardOutput, RolloutBatch


@dataclass(frozen=True)
class Scored:
    """A scored step: rewards of all V responses, the trained G as sequences with their advantages."""

    rewards: RewardOutput
    """``[P, V]``."""
    advantages: torch.Tensor
    """``[P, G]``, of the trained responses."""
    seqs: Sequences
    """The trained responses, on the policy's device, their advantages set."""
    policy_pass: PolicyPass | None
    """The policy pass a reward read, for the update's old log-probs; ``None`` when the reward read none."""


PAD_ID = 0
"""Right-padding positions are masked out of attention and loss, so their token id is never read: any id serves."""


def score(reward: Reward, advantages_of: GroupAdvantages, rollouts: RolloutBatch, device: torch.device,
          policy_pass: Callable[[Sequences, float], PolicyPass], vocabulary: int) -> Scored:
    """Rewards ``[P, V]``, then group advantages of the trained ``[P, G]`` and their sequences (scored under the
    temperature the rollouts were sampled at). ``policy_pass(seqs, temperature)`` and the policy's ``vocabulary``
    size serve a reward that reads the policy."""
    seqs = trained_sequences(rollouts, torch.zeros(rollouts.trained.shape), PAD_ID).to(device)
    passed = None
    if reward.needs_policy:
        passed = policy_pass(seqs, rollouts.temperature)
        signal = PolicySignal.from_tokens(rollouts.trained, seqs.response_mask, logp=passed.logp,
                                          entropy=passed.entropy, mean_logp=passed.mean_logp, vocabulary=vocabulary)
        rewards = reward(rollouts, policy=signal)
    else:
        rewards = reward(rollouts)
    advantages = advantages_of(rewards.rewards.gather(1, rollouts.trained))  # [P, G]
    seqs = replace(seqs, advantages=advantages.reshape(-1).float().to(device))
    return Scored(rewards, advantages, seqs=seqs, policy_pass=passed)
