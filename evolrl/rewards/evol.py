"""EVOL-RL: majority selects, novelty varies (the paper's section 3.2)."""

from __future__ import annotations

from evolrl.rewards.answers import ValidRule
from evolrl.rewards.base import AnswerReward, NoveltyBands, NoveltyText
from evolrl.rewards.embedders import Embedder
from evolrl.types import RewardOutput, RolloutBatch


class EvolReward(AnswerReward):
    """Majority-vote label over the valid responses, novelty inside the two bands.

    Majority responses earn ``[0.5, 1]``, minority ``[-1, -0.5]``, invalid ``-1``.

    Args:
        embedder: Sentence embedder for novelty; ``None`` means the packaged all-MiniLM-L6-v2.
        alpha: Weight of the intra-group mean similarity against the max similarity.
        novelty_text: ``response`` (text after ``</think>``) or ``reasoning`` (same, final box removed).
        valid_rule: ``digit`` (paper), ``nonempty`` or ``any``.
        number_fallback: Accept a bare last number as the boxed answer.
    """

    def __init__(
        self,
        embedder: Embedder | None = None,
        alpha: float = 0.5,
        novelty_text: NoveltyText = "response",
        valid_rule: ValidRule = "digit",
        number_fallback: bool = False,
    ) -> None:
        super().__init__(valid_rule, number_fallback)
        self.bands = NoveltyBands(embedder, alpha, novelty_text)

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        sheet = self.read(batch)
        rewards, novelty = self.bands(batch, sheet.majority, sheet.valid)
        return RewardOutput(
            rewards=rewards,
            answers=sheet.answers,
            labels=sheet.labels,
            components={
                "valid": sheet.valid,
                "majority": sheet.majority,
                "novelty": novelty,
                "answer_class": sheet.answer_class,
            },
        )
