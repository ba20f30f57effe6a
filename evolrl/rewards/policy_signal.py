"""Rewards that read the policy: what it says of each trained response, and the base class of such rewards.

Self-certainty (Intuitor) and token entropy (RENT) score a response by the policy's own next-token distributions, so
they cannot run, as the other rewards do, before any policy pass. The module gives them a :class:`PolicySignal`:
one no-grad pass of the policy over the step's *trained* responses (the G of each group's V), with the weights that
sampled them, at the sampling temperature; the update then takes its old log-probs from that same pass, so the
extra cost is a no-grad forward over the first mini-batch (the others' old log-probs were a pass of their own
anyway). These are the trainer's numbers, not the sampler's.

A reward's ``[P, V]`` contract holds: a response that was not trained on was not scored and its reward is NaN
(the diagnostics average over the scored ones; advantages use only the trained G, which all have a number).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.context import RewardContext
from evolrl.types import RewardOutput, RolloutBatch


@dataclass(frozen=True)
class PolicySignal:
    """Per trained response, ``[P, G]`` (response ``trained[p, g]`` of group ``p``), means over its tokens."""

    trained: Tensor
    """``[P, G]`` indices into each group's V responses."""
    entropy: Tensor
    """Mean token entropy of ``softmax(logits / T)``, nats."""
    self_certainty: Tensor
    """Mean over tokens of KL(uniform || p): ``-log V - mean_j log p_j``, nats (0 for a uniform policy)."""
    logprob: Tensor
    """Mean log-prob of the sampled tokens."""

    @staticmethod
    def from_tokens(trained: Tensor, mask: Tensor, logp: Tensor, entropy: Tensor, mean_logp: Tensor,
                    vocabulary: int) -> PolicySignal:
        """Token values ``[P * G, L]`` (group-major, aligned with ``mask``, the response tokens) to per-response
        means; a response without tokens gets 0."""
        tokens = mask.sum(-1).clamp(min=1)

        def mean(values: Tensor) -> Tensor:
            return ((values.float() * mask).sum(-1) / tokens).view(trained.shape).cpu()

        certainty = -math.log(vocabulary) - mean_logp.float()
        return PolicySignal(trained, mean(entropy), self_certainty=mean(certainty), logprob=mean(logp))

    def per_response(self, values: Tensor, vote_samples: int) -> Tensor:
        """``[P, G]`` values placed at their responses in ``[P, V]``; NaN where a response was not trained on."""
        out = torch.full((values.shape[0], vote_samples), math.nan)
        return out.scatter(1, self.trained.cpu(), values.float())


class PolicyReward(AnswerReward):
    """Base of rewards that read the policy (:class:`PolicySignal`); it also reads answers, only for the diagnostics
    (majority ratio, distinct answers, label accuracy), never for the reward.

    Args:
        answers: How answers are read for the diagnostics' vote (never for the reward).
    """

    needs_policy = True

    def __init__(self, answers: AnswerRules = EVERY_ANSWER) -> None:
        super().__init__(answers)

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        policy = context.policy if context is not None else None
        if policy is None:
            raise TypeError(f"{type(self).__name__} reads the policy: call it with the step's PolicySignal as the "
                            "RewardContext's policy (EvolRLModule does; see evolrl.rewards.policy_signal)")
        score, name = self.policy_rewards(policy)  # [P, G]
        sheet = self.read(batch)
        scored = policy.per_response(score, batch.group_size)
        return self.output(sheet, scored, **{name: scored})

    @abstractmethod
    def policy_rewards(self, policy: PolicySignal) -> tuple[Tensor, str]:
        """``([P, G] rewards of the trained responses, component name)``; the name is one of :attr:`components`."""
