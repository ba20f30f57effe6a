"""RENT's reward: confidence as the negative entropy of the policy over the response."""

from __future__ import annotations

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
        valid_rule: Which answers take part in the diagnostics' vote (not in the reward).
        number_fallback: Read a number as the answer when there is no ``\\boxed{}``.
        fallback_rule: Which number the fallback reads: ``last_number`` or ``first_result`` (see
            :mod:`evolrl.rewards.answers`).
    """

    def policy_rewards(self, policy: PolicySignal) -> tuple[Tensor, str]:
        return -policy.entropy, "neg_entropy"
