"""EMPO's reward: how probable a response's meaning is within its group."""

from __future__ import annotations

from types import MappingProxyType

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.context import RewardContext
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
        answers: How answers are read and which count (by default every response with an answer).
    """

    components = MappingProxyType({**AnswerReward.components,
                                   "cluster_share": "float: the share of the group in its answer's cluster"})

    def __init__(self, answers: AnswerRules = EVERY_ANSWER) -> None:
        super().__init__(answers)

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        sheet = self.read(batch)
        classes = sheet.answer_class  # [P, V], -1: no valid answer
        same = (classes[:, :, None] == classes[:, None, :]) & (classes[:, :, None] >= 0)  # [P, V, V]
        share = same.sum(-1).float() / classes.shape[1]  # [P, V]
        return self.output(sheet, share, cluster_share=share)
