"""Scoring a training step's rollouts: the reward of every response, then the trained sequences with advantages.

A reward that reads the policy (``reward.needs_policy``: self-certainty, token entropy) is given one no-grad pass of
the policy over the trained sequences (``GRPOUpdate.policy_pass``), which the update then reuses for its old log-probs;
any other reward reads the responses only and no pass is made here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from evolrl.algorithms import group_advantages
from evolrl.rewards import Reward
from evolrl.rewards.policy_signal import PolicySignal
from evolrl.training.sequences import Sequences, trained_sequences
from evolrl.training.update import GRPOUpdate, PolicyPass
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


def score(reward: Reward, update: GRPOUpdate, policy: nn.Module, rollouts: RolloutBatch,
          device: torch.device) -> Scored:
    """Rewards ``[P, V]``, then group advantages of the trained ``[P, G]`` and their sequences (scored under the
    temperature the rollouts were sampled at)."""
    seqs = trained_sequences(rollouts, torch.zeros(rollouts.trained.shape), PAD_ID).to(device)
    policy_pass = None
    if getattr(reward, "needs_policy", False):
        policy_pass = update.policy_pass(policy, seqs, rollouts.temperature)
        vocabulary = policy.get_output_embeddings().weight.shape[0]
        signal = PolicySignal.from_tokens(rollouts.trained, seqs.response_mask, logp=policy_pass.logp,
                                          entropy=policy_pass.entropy, mean_logp=policy_pass.mean_logp,
                                          vocabulary=vocabulary)
        rewards = reward(rollouts, policy=signal)
    else:
        rewards = reward(rollouts)
    advantages = group_advantages(rewards.rewards.gather(1, rollouts.trained), update.loss.scale_by_std)  # [P, G]
    seqs = replace(seqs, advantages=advantages.reshape(-1).float().to(device))
    return Scored(rewards, advantages, seqs=seqs, policy_pass=policy_pass)
