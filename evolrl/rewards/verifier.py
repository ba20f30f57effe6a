"""RLVR baseline: reward from the ground truth, optionally with EVOL-RL's novelty bands."""

from __future__ import annotations

import torch

from evolrl.rewards.answers import ValidRule
from evolrl.rewards.base import AnswerReward, NoveltyBands, NoveltyText
from evolrl.rewards.embedders import Embedder
from evolrl.rewards.equivalence import answers_equivalent
from evolrl.types import RewardOutput, RolloutBatch


class VerifierReward(AnswerReward):
    """``r = 1`` if a valid response's answer is equivalent to the prompt's ground truth, else ``0``.

    With ``novelty=True`` the correct/incorrect split takes the majority's place in EVOL-RL's
    bands: correct ``[0.5, 1]``, incorrect ``[-1, -0.5]``, invalid ``-1``.

    Args:
        novelty: Use the novelty bands instead of 0/1.
        embedder: Sentence embedder when ``novelty`` (``None``: the packaged all-MiniLM-L6-v2).
        alpha: Novelty weight of the intra-group mean against the max.
        novelty_text: ``response`` or ``reasoning``.
        valid_rule: ``digit``, ``nonempty`` or ``any``.
        number_fallback: Accept a bare last number as the answer.
    """

    def __init__(
        self,
        novelty: bool = False,
        embedder: Embedder | None = None,
        alpha: float = 0.5,
        novelty_text: NoveltyText = "response",
        valid_rule: ValidRule = "nonempty",
        number_fallback: bool = False,
    ) -> None:
        super().__init__(valid_rule, number_fallback)
        self.bands = NoveltyBands(embedder, alpha, novelty_text) if novelty else None

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        missing = [p for p in batch.prompts if p.answer is None]
        if missing:
            where = ", ".join(f"{p.id!r} (from {p.source or 'unknown source'})" for p in missing[:5])
            raise ValueError(
                f"VerifierReward needs a ground-truth answer for every prompt; missing for {where}. "
                "Use a data file with an answer field, or a label-free reward (EvolReward, MajorityVoteReward)."
            )
        sheet = self.read(batch)
        correct = torch.tensor(
            [
                [ok and answers_equivalent(a, p.answer) for a, ok in zip(row, oks)]
                for row, oks, p in zip(sheet.answers, sheet.valid.tolist(), batch.prompts)
            ],
            dtype=torch.bool,
        )
        components = {"valid": sheet.valid, "majority": sheet.majority, "correct": correct,
                      "answer_class": sheet.answer_class}
        if self.bands is None:
            rewards = correct.float()
        else:
            rewards, components["novelty"] = self.bands(batch, correct, sheet.valid)
        return RewardOutput(rewards=rewards, answers=sheet.answers, labels=tuple(p.answer for p in batch.prompts),
                            components=components)
