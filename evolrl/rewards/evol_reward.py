"""EVOL-RL: majority selects, novelty varies (the paper's section 3.2)."""

from __future__ import annotations

from types import MappingProxyType

from torch import Tensor

from evolrl.rewards.answer_rules import AnswerRules
from evolrl.rewards.answer_sheet import AnswerSheet
from evolrl.rewards.consensus_gate import ConsensusGate
from evolrl.rewards.majority_vote_reward import MajorityVoteReward
from evolrl.rewards.novelty_bands import NOVELTY_COMPONENTS, NoveltyBands
from evolrl.settings import require
from evolrl.types import RolloutBatch

PAPER_ANSWERS = AnswerRules(valid_rule="digit", number_fallback=False)
"""The paper's rules (its appendix A.3): a response is valid only with a boxed answer that holds a digit."""


class EvolReward(MajorityVoteReward):
    """Majority-vote label over the valid responses, novelty inside the two bands.

    Majority responses earn ``[0.5, 1]``, minority ``[-1, -0.5]``, invalid ``-1``.

    Args:
        novelty: The novelty bands: embedder, ``alpha`` and ``novelty_text`` (see
            :class:`~evolrl.rewards.NoveltyBands`); ``None`` means ``NoveltyBands()``, the packaged
            all-MiniLM-L6-v2 with ``alpha`` 0.5 on the whole response.
        answers: How answers are read; by default the paper's: only a boxed answer with a digit is valid.
        gate: When a group's majority may teach (:class:`~evolrl.rewards.ConsensusGate`); ``null``: always.
    """

    components = MappingProxyType({**MajorityVoteReward.components, **NOVELTY_COMPONENTS})

    def __init__(
        self,
        novelty: NoveltyBands | None = None,
        answers: AnswerRules = PAPER_ANSWERS,
        gate: ConsensusGate | None = None,
    ) -> None:
        super().__init__(answers, gate)
        require(novelty is None or isinstance(novelty, NoveltyBands), "EvolReward.novelty", novelty,
                allowed="an evolrl.rewards.NoveltyBands or null for the default one")
        self.bands = novelty if novelty is not None else NoveltyBands()

    def score(self, batch: RolloutBatch, sheet: AnswerSheet) -> tuple[Tensor, dict[str, Tensor]]:
        return self.bands(batch, sheet.majority, sheet.valid, spans=sheet.stated)
