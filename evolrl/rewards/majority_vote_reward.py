"""TTRL baseline: reward 1 for agreeing with the group's majority answer, else 0."""

from __future__ import annotations

from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.answers import FallbackRule, ValidRule
from evolrl.types import RewardOutput, RolloutBatch


class MajorityVoteReward(AnswerReward):
    """``r = 1`` if the response's answer is equivalent to the majority label, else ``0``.

    Args:
        valid_rule: Which responses take part in the vote (``any``: all with an answer, as in TTRL).
        number_fallback: Read a number as the answer when there is no ``\\boxed{}``.
        fallback_rule: Which number the fallback reads: ``last_number`` or ``first_result`` (see
            :mod:`evolrl.rewards.answers`).
    """

    def __init__(self, valid_rule: ValidRule = "any", number_fallback: bool = True,
                 fallback_rule: FallbackRule = "last_number") -> None:
        super().__init__(valid_rule, number_fallback, fallback_rule)

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        sheet = self.read(batch)
        return RewardOutput(
            rewards=sheet.majority.float(),
            answers=sheet.answers,
            labels=sheet.labels,
            components=sheet.components(),
        )
