"""RLVR baseline: reward from the ground truth, optionally with EVOL-RL's novelty bands."""

from __future__ import annotations

from types import MappingProxyType

import torch

from evolrl.rewards.answer_rules import AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.equivalence import answers_equivalent
from evolrl.rewards.novelty_bands import NOVELTY_COMPONENTS, NoveltyBands
from evolrl.settings import require
from evolrl.rewards.context import RewardContext
from evolrl.types import RewardOutput, RolloutBatch, unanswered

ANSWER_HINT = ("Give those rows an answer (or set answer_field to the field that holds it), or train with a "
               "label-free reward (EvolReward, MajorityVoteReward).")

BOXED_ANSWERS = AnswerRules(valid_rule="nonempty", number_fallback=False)
"""A verifier's default rules: any non-empty boxed answer is graded; a response without a box is wrong."""


class VerifierReward(AnswerReward):
    """``r = 1`` if a valid response's answer is equivalent to the prompt's ground truth, else ``0``.

    With a ``novelty`` object the correct/incorrect split takes the majority's place in EVOL-RL's
    bands: correct ``[0.5, 1]``, incorrect ``[-1, -0.5]``, invalid ``-1``.

    Args:
        novelty: ``None``: the plain 0/1 verifier. A :class:`~evolrl.rewards.NoveltyBands` (embedder,
            ``alpha``, ``novelty_text``): EVOL-RL's novelty bands on correct/incorrect.
        answers: How answers are read; by default any boxed answer is valid, and only a boxed one is read.
    """

    components = MappingProxyType({
        **AnswerReward.components,
        "correct": "bool: its answer is valid and equivalent to the prompt's ground truth",
        **{name: text + "; only with novelty bands" for name, text in NOVELTY_COMPONENTS.items()},
    })

    def __init__(
        self,
        novelty: NoveltyBands | None = None,
        answers: AnswerRules = BOXED_ANSWERS,
    ) -> None:
        super().__init__(answers)
        require(novelty is None or isinstance(novelty, NoveltyBands), "VerifierReward.novelty", novelty,
                allowed="an evolrl.rewards.NoveltyBands, or null for the plain 0/1 verifier")
        self.bands = novelty

    needs_answers = True

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        missing = unanswered(batch.prompts)
        if missing:
            raise ValueError(f"VerifierReward needs a ground-truth answer for every prompt: {missing}. {ANSWER_HINT}")
        sheet = self.read(batch)
        correct = torch.tensor(
            [
                [ok and answers_equivalent(a, p.answer) for a, ok in zip(row, oks)]
                for row, oks, p in zip(sheet.answers, sheet.valid.tolist(), batch.prompts)
            ],
            dtype=torch.bool,
        )
        labels = tuple(p.answer for p in batch.prompts)
        if self.bands is None:
            return self.output(sheet, correct.float(), labels, correct=correct)
        rewards, parts = self.bands(batch, correct, sheet.valid, spans=sheet.stated)
        return self.output(sheet, rewards, labels, correct=correct, **parts)
