"""Intuitor's reward: the policy's self-certainty in its own response."""

from __future__ import annotations

from types import MappingProxyType

from torch import Tensor

from evolrl.rewards.policy_signal import PolicyReward, PolicySignal


class SelfCertaintyReward(PolicyReward):
    """``r = (1/|o|) sum_i KL(U || p(. | q, o_<i))``, the mean over the response's tokens of the KL divergence from the
    uniform distribution over the vocabulary to the policy's next-token distribution.

    Zhao et al. 2025, "Learning to Reason without External Rewards" (Intuitor), the self-certainty of their section 3:
    ``-(1 / (|o| |V|)) sum_i sum_j log(|V| p(j | q, o_<i))``, used as the GRPO reward. As in the authors' verl code
    (``self_certainty_from_logits``, computed in the old-log-prob pass): the current policy's numbers, without
    gradients, over the response tokens only, of ``softmax(logits / T)`` at the sampling temperature; advantages
    are then normalized within each group (GRPO). Theirs drops the constant ``log |V|``, which the group
    normalization cancels; here it is kept, so the logged reward is the KL itself. Reads the trainer's policy, not
    the sampler's (:class:`~evolrl.rewards.policy_signal.PolicySignal`); untrained responses get NaN.

    Args:
        answers: How answers are read for the diagnostics' vote (never for the reward).
    """

    components = MappingProxyType({
        **PolicyReward.components,
        "self_certainty": "float: its self-certainty under the policy (NaN where not scored)",
    })

    def policy_rewards(self, policy: PolicySignal) -> tuple[Tensor, str]:
        return policy.self_certainty, "self_certainty"
