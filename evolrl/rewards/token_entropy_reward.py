"""RENT's reward: confidence as the negative entropy of the policy over the response."""

from __future__ import annotations

from types import MappingProxyType

from torch import Tensor

from evolrl.rewards.policy_signal import PolicyReward, PolicySignal


class TokenEntropyReward(PolicyReward):
    """``r = -(1/|o|) sum_t H(p(. | q, o_<t))``, the negative mean token entropy of the response under the policy.

    Prabhudesai et al. 2025, "Maximizing Confidence Alone Improves Reasoning" (RENT): the reward is the negative
    entropy of the policy's token distributions over the response. The paper also studies entropy over parts of
    the response (e.g. its last tokens); this follows the released code's main setting, the mean over all
    response tokens, from the old-log-prob pass (current policy, no gradients, ``softmax(logits / T)``). Not
    included: that code's fixed penalty for a response without an answer. Reads the trainer's policy
    (:class:`~evolrl.rewards.policy_signal.PolicySignal`); untrained responses get NaN.

    Args:
        answers: How answers are read for the diagnostics' vote (never for the reward).
    """

    components = MappingProxyType({
        **PolicyReward.components,
        "neg_entropy": "float: minus its mean token entropy under the policy (NaN where not scored)",
    })

    def policy_rewards(self, policy: PolicySignal) -> tuple[Tensor, str]:
        return -policy.entropy, "neg_entropy"
