"""EVOL-RL: majority selects, novelty varies (the paper's section 3.2)."""

from __future__ import annotations

from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.answers import FallbackRule, ValidRule
from evolrl.rewards.novelty_bands import NoveltyBands
from evolrl.settings import require
from evolrl.types import RewardOutput, RolloutBatch


class EvolReward(AnswerReward):
    """Majority-vote label over the valid responses, novelty inside the two bands.

    Majority responses earn ``[0.5, 1]``, minority ``[-1, -0.5]``, invalid ``-1``.

    Args:
        novelty: The novelty bands: embedder, ``alpha`` and ``novelty_text`` (see
            :class:`~evolrl.rewards.NoveltyBands`); ``None`` means ``NoveltyBands()``, the packaged
            all-MiniLM-L6-v2 with ``alpha`` 0.5 on the whole response.
        valid_rule: ``digit`` (paper), ``nonempty`` or ``any``.
        number_fallback: Accept a bare number as the boxed answer.
        fallback_rule: Which number the fallback reads: ``last_number`` or ``first_result`` (see
            :mod:`evolrl.rewards.answers`).
    """

    def __init__(
        self,
        novelty: NoveltyBands | None = None,
        valid_rule: ValidRule = "digit",
        number_fallback: bool = False,
        fallback_rule: FallbackRule = "last_number",
    ) -> None:
        super().__init__(valid_rule, number_fallback, fallback_rule)
        require(novelty is None or isinstance(novelty, NoveltyBands), "EvolReward.novelty", novelty,
                allowed="an evolrl.rewards.NoveltyBands or null for the default one")
        self.bands = novelty if novelty is not None else NoveltyBands()

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        sheet = self.read(batch)
        rewards, novelty = self.bands(batch, sheet.majority, sheet.valid, spans=sheet.spans)
        return RewardOutput(
            rewards=rewards,
            answers=sheet.answers,
            labels=sheet.labels,
            components={**sheet.components(), "novelty": novelty},
        )
