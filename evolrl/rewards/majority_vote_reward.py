"""TTRL baseline: reward 1 for agreeing with the group's majority answer, else 0; the base of the majority-vote family.

EVOL-RL (``EvolReward``) and RESTRAIN (``RestrainReward``) score from the same vote; all of them take a
:class:`~evolrl.rewards.consensus_gate.ConsensusGate` (``gate``), which decides when a group's majority may teach.
"""

from __future__ import annotations

from types import MappingProxyType

from torch import Tensor

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward, AnswerSheet
from evolrl.rewards.consensus_gate import COMPONENTS as GATE_COMPONENTS
from evolrl.rewards.consensus_gate import ConsensusGate
from evolrl.rewards.novelty_bands import NOVELTY_COMPONENTS, NoveltyBands
from evolrl.rewards.context import RewardContext
from evolrl.settings import require
from evolrl.types import RewardOutput, RolloutBatch


class MajorityVoteReward(AnswerReward):
    """``r = 1`` if the response's answer is equivalent to the majority label, else ``0``.

    Args:
        answers: How answers are read; by default every response with an answer votes, as in TTRL.
        gate: When a group's majority may teach (:class:`~evolrl.rewards.ConsensusGate`); ``null``: always.
        watch_novelty: Novelty bands whose novelty is measured and logged (``train/novelty_*``), never rewarded:
            TTRL's novelty read as EVOL-RL reads it, for comparing the two; ``null``: none measured.
    """

    components = MappingProxyType({**AnswerReward.components, **GATE_COMPONENTS, **NOVELTY_COMPONENTS})

    def __init__(self, answers: AnswerRules = EVERY_ANSWER, gate: ConsensusGate | None = None,
                 watch_novelty: NoveltyBands | None = None) -> None:
        super().__init__(answers)
        require(gate is None or isinstance(gate, ConsensusGate), f"{type(self).__name__}.gate", gate,
                allowed="null (no gating) or an evolrl.rewards.ConsensusGate")
        require(watch_novelty is None or isinstance(watch_novelty, NoveltyBands),
                f"{type(self).__name__}.watch_novelty", watch_novelty, allowed="null or an evolrl.rewards.NoveltyBands")
        self.gate, self.watched = gate, watch_novelty

    @property
    def needs_policy(self) -> bool:  # SCRL's entropy-gated negatives read the policy's token entropy
        return self.gate is not None and self.gate.reads_policy

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        policy = context.policy if context is not None else None
        sheet = self.read(batch)
        rewards, parts = self.score(batch, sheet)
        if self.gate is not None:
            entropy = policy.per_response(policy.entropy, batch.group_size) if policy is not None else None
            rewards, gated = self.gate(rewards, sheet.answer_class, entropy)
            parts |= gated
        return self.output(sheet, rewards, **parts)

    def score(self, batch: RolloutBatch, sheet: AnswerSheet) -> tuple[Tensor, dict[str, Tensor]]:
        """``[P, V]`` rewards before the gate, and the components they were built from (and the watched novelty)."""
        if self.watched is None:
            return sheet.majority.float(), {}
        return sheet.majority.float(), self.watched(batch, sheet.majority, sheet.valid, spans=sheet.stated)[1]
