"""What a batch's responses answer: answers, validity, equivalence classes and the majority label.

:class:`AnswerReward` is the base of every reward that reads answers; its :meth:`~AnswerReward.read`
returns an :class:`AnswerSheet` (``[P, V]`` tensors and the majority label of every prompt, voted
over the valid answers only), and where each answer was read (the novelty text and the trailing-text
flag come from those same spans).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.rewards.answers import (
    FALLBACK_RULES,
    VALID_RULES,
    AnswerSpan,
    FallbackRule,
    ValidRule,
    has_trailing_text,
    is_valid_answer,
    read_answer,
)
from evolrl.rewards.base import Reward
from evolrl.rewards.voting import group_answers, majority_class
from evolrl.settings import check_choice, require
from evolrl.types import RolloutBatch


class AnswerReward(Reward):
    """Shared answer handling: extraction, validity and equivalence classes per prompt.

    Args:
        valid_rule: ``digit`` (paper: a boxed answer containing a digit), ``nonempty`` or ``any``.
        number_fallback: Read a number as the answer when a response has no ``\\boxed{}``
            (it then also counts as boxed for validity).
        fallback_rule: Which number: ``last_number`` (the last one) or ``first_result`` (the result of the
            first equation, so text after a one-line answer cannot cast the vote; see
            :mod:`evolrl.rewards.answers`).
    """

    def __init__(self, valid_rule: ValidRule = "digit", number_fallback: bool = False,
                 fallback_rule: FallbackRule = "last_number") -> None:
        name = type(self).__name__
        check_choice(f"{name}.valid_rule", valid_rule, VALID_RULES)
        require(isinstance(number_fallback, bool), f"{name}.number_fallback", number_fallback, allowed="true or false")
        check_choice(f"{name}.fallback_rule", fallback_rule, FALLBACK_RULES)
        self.valid_rule = valid_rule
        self.number_fallback = number_fallback
        self.fallback_rule = fallback_rule

    def read(self, batch: RolloutBatch) -> AnswerSheet:
        """Answers, validity and the majority vote of every prompt (over valid answers only)."""
        spans = tuple(tuple(read_answer(t, self.number_fallback, self.fallback_rule) for t in texts)
                      for texts in batch.texts)
        answers = tuple(tuple(None if s is None else s.answer for s in row) for row in spans)
        valid = [[is_valid_answer(a, self.valid_rule) for a in row] for row in answers]
        trailing = [[has_trailing_text(t, s) for t, s in zip(texts, row)] for texts, row in zip(batch.texts, spans)]
        classes = [group_answers([a if ok else None for a, ok in zip(*row)]) for row in zip(answers, valid)]
        winners = [majority_class(row) for row in classes]
        return AnswerSheet(
            answers=answers,
            valid=torch.tensor(valid, dtype=torch.bool),
            answer_class=torch.tensor([[-1 if c is None else c for c in row] for row in classes], dtype=torch.long),
            majority=torch.tensor([[w is not None and c == w for c in row] for row, w in zip(classes, winners)]),
            labels=tuple(None if w is None else ans[row.index(w)] for ans, row, w in zip(answers, classes, winners)),
            spans=spans,
            trailing=torch.tensor(trailing, dtype=torch.bool),
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
    spans: tuple[tuple[AnswerSpan | None, ...], ...]
    """Where each answer was read, ``[P][V]`` (``None``: no answer)."""
    trailing: Tensor
    """Whether a letter or digit follows the answer (``False`` without one)."""

    def components(self) -> dict[str, Tensor]:
        """The reward components every answer-reading reward reports."""
        return {"valid": self.valid, "majority": self.majority, "answer_class": self.answer_class,
                "trailing": self.trailing}
