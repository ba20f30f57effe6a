"""What a batch's responses answer: answers, validity, equivalence classes and the majority label.

:class:`AnswerReward` is the base of every reward that reads answers; its :meth:`~AnswerReward.read`
returns an :class:`AnswerSheet` (``[P, V]`` tensors and the majority label of every prompt, voted
over the valid answers only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.rewards.answers import VALID_RULES, ValidRule, extract_answer, is_valid_response
from evolrl.rewards.base import Reward
from evolrl.rewards.voting import group_answers, majority_class
from evolrl.settings import check_choice, require
from evolrl.types import RolloutBatch


class AnswerReward(Reward):
    """Shared answer handling: extraction, validity and equivalence classes per prompt.

    Args:
        valid_rule: ``digit`` (paper: a boxed answer containing a digit), ``nonempty`` or ``any``.
        number_fallback: Read the last number as the answer when a response has no ``\\boxed{}``
            (it then also counts as boxed for validity).
    """

    def __init__(self, valid_rule: ValidRule = "digit", number_fallback: bool = False) -> None:
        name = type(self).__name__
        check_choice(f"{name}.valid_rule", valid_rule, VALID_RULES)
        require(isinstance(number_fallback, bool), f"{name}.number_fallback", number_fallback, "true or false")
        self.valid_rule = valid_rule
        self.number_fallback = number_fallback

    def read(self, batch: RolloutBatch) -> AnswerSheet:
        """Answers, validity and the majority vote of every prompt (over valid answers only)."""
        answers = tuple(tuple(extract_answer(t, self.number_fallback) for t in texts) for texts in batch.texts)
        valid = [[is_valid_response(t, self.valid_rule, self.number_fallback) for t in texts] for texts in batch.texts]
        classes = [group_answers([a if ok else None for a, ok in zip(*row)]) for row in zip(answers, valid)]
        winners = [majority_class(row) for row in classes]
        return AnswerSheet(
            answers=answers,
            valid=torch.tensor(valid, dtype=torch.bool),
            answer_class=torch.tensor([[-1 if c is None else c for c in row] for row in classes], dtype=torch.long),
            majority=torch.tensor([[w is not None and c == w for c in row] for row, w in zip(classes, winners)]),
            labels=tuple(None if w is None else ans[row.index(w)] for ans, row, w in zip(answers, classes, winners)),
        )


@dataclass(frozen=True)
class AnswerSheet:
    """What :meth:`AnswerReward.read` finds in a batch; tensors are ``[P, V]``."""

    answers: tuple[tuple[str | None, ...], ...]
    valid: Tensor
    answer_class: Tensor
    """Equivalence class of each valid answer in order of first appearance, -1 for none."""
    majority: Tensor
    labels: tuple[str | None, ...]
    """Majority label per prompt (its first member as written), ``None`` without valid answers."""
