"""EMPO's reward: how probable a response's meaning is within its group."""

from __future__ import annotations

from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.answers import FallbackRule, ValidRule
from evolrl.types import RewardOutput, RolloutBatch


class SemanticEntropyReward(AnswerReward):
    """``r_i = |c_i| / V``: the share of the group's V responses in the meaning cluster of response i; 0 for a
    response without a valid answer.

    Zhang et al. 2025, "Right Question is Already Half the Answer: Fully Unsupervised LLM Reasoning
    Incentivization" (EMPO): responses are clustered by meaning and each is rewarded with its cluster's empirical
    probability ``p(c_j | q) = |c_j| / G``, which minimizes the group's semantic entropy. For math the clusters are
    answer-equivalence classes, here evolrl's own (``AnswerSheet.answer_class``: ``math-verify`` equivalence);
    as in the authors' TRL code for math, a response without an answer gets 0 and still counts in the denominator.
    The cluster shares are over all V vote samples, as TTRL's and EVOL-RL's votes are. Not included: the code's
    group filter, which zeroes a group whose answers all differ (every response then has ``1/V`` anyway, so
    its advantages are already 0).

    Args:
        valid_rule: Which responses have an answer that counts (``any``: all with an answer).
        number_fallback: Read a number as the answer when there is no ``\\boxed{}``.
        fallback_rule: Which number the fallback reads: ``last_number`` or ``first_result`` (see
            :mod:`evolrl.rewards.answers`).
    """

    def __init__(self, valid_rule: ValidRule = "any", number_fallback: bool = True,
                 fallback_rule: FallbackRule = "last_number") -> None:
        super().__init__(valid_rule, number_fallback, fallback_rule)

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        sheet = self.read(batch)
        classes = sheet.answer_class  # [P, V], -1: no valid answer
        same = (classes[:, :, None] == classes[:, None, :]) & (classes[:, :, None] >= 0)  # [P, V, V]
        share = same.sum(-1).float() / classes.shape[1]  # [P, V]
        return RewardOutput(
            rewards=share, answers=sheet.answers, labels=sheet.labels,
            components={**sheet.components(), "cluster_share": share},
        )
