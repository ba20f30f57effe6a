"""TTRL baseline: reward 1 for agreeing with the group's majority answer, else 0."""

from __future__ import annotations

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.types import RewardOutput, RolloutBatch


class MajorityVoteReward(AnswerReward):
    """``r = 1`` if the response's answer is equivalent to the majority label, else ``0``.

    Args:
        answers: How answers are read; by default every response with an answer votes, as in TTRL.
    """

    def __init__(self, answers: AnswerRules = EVERY_ANSWER) -> None:
        super().__init__(answers)

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        sheet = self.read(batch)
        return self.output(sheet, sheet.majority.float())
