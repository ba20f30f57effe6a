"""What a batch's responses answer: answers, validity, equivalence classes and the majority label.

:class:`AnswerReward` is the base of every reward that reads answers; its :meth:`~AnswerReward.read`
returns an :class:`AnswerSheet` (``[P, V]`` tensors and the majority label of every prompt, voted
over the valid answers only), where each answer was read, and where each response first states it as a result
(the novelty text and the trailing-text flag come from that first statement, so a restatement earns nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules, check_rules
from evolrl.rewards.answers import AnswerSpan, has_trailing_text
from evolrl.rewards.base import Reward
from evolrl.rewards.statements import first_statement
from evolrl.rewards.voting import group_answers, majority_class
from evolrl.types import Components, RewardOutput, RolloutBatch


class AnswerReward(Reward):
    """Shared answer handling: extraction, validity and equivalence classes per prompt.

    Args:
        answers: How answers are read and which responses are valid (:class:`~evolrl.rewards.AnswerRules`).
    """

    components = MappingProxyType({
        "valid": "bool: its answer is valid (the reward's answers.valid_rule)",
        "majority": "bool: its answer is equivalent to the group's majority label",
        "answer_class": "int: its answer's equivalence class in the group, in order of appearance (-1: no answer)",
        "trailing": "bool: a letter or digit follows the first statement of its answer (False without one)",
    })

    def __init__(self, answers: AnswerRules = EVERY_ANSWER) -> None:
        check_rules(type(self).__name__, answers)
        self.answers = answers

    def read(self, batch: RolloutBatch) -> AnswerSheet:
        """Answers, validity and the majority vote of every prompt (over valid answers only)."""
        spans = tuple(tuple(self.answers.read(t) for t in texts) for texts in batch.texts)
        answers = tuple(tuple(None if s is None else s.answer for s in row) for row in spans)
        valid = [[self.answers.valid(a) for a in row] for row in answers]
        stated = tuple(tuple(None if s is None else first_statement(t, s) for t, s in zip(texts, row))
                       for texts, row in zip(batch.texts, spans))
        trailing = [[has_trailing_text(t, s, g) for t, s, g in zip(texts, row, read)]
                    for texts, row, read in zip(batch.texts, stated, spans)]
        classes = [group_answers([a if ok else None for a, ok in zip(*row)]) for row in zip(answers, valid)]
        winners = [majority_class(row) for row in classes]
        return AnswerSheet(
            answers=answers,
            valid=torch.tensor(valid, dtype=torch.bool),
            answer_class=torch.tensor([[-1 if c is None else c for c in row] for row in classes], dtype=torch.long),
            majority=torch.tensor([[w is not None and c == w for c in row] for row, w in zip(classes, winners)]),
            labels=tuple(None if w is None else ans[row.index(w)] for ans, row, w in zip(answers, classes, winners)),
            spans=spans,
            stated=stated,
            trailing=torch.tensor(trailing, dtype=torch.bool),
        )

    def output(self, sheet: AnswerSheet, rewards: Tensor, labels: tuple[str | None, ...] | None = None,
               **parts: Tensor) -> RewardOutput:
        """``rewards`` with the sheet's answers and components plus ``parts`` (each declared in
        :attr:`components`); ``labels``: the majority labels unless given."""
        return RewardOutput(rewards=rewards, answers=sheet.answers, labels=sheet.labels if labels is None else labels,
                            components=Components({**sheet.components(), **parts}, self.components))


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
    stated: tuple[tuple[AnswerSpan | None, ...], ...]
    """Where each response first states its answer as a result (``statements.first_statement``), ``[P][V]``."""
    trailing: Tensor
    """Whether a letter or digit follows that first statement (``False`` without an answer)."""

    def components(self) -> dict[str, Tensor]:
        """The reward components every answer-reading reward reports (declared in ``AnswerReward.components``)."""
        return {"valid": self.valid, "majority": self.majority, "answer_class": self.answer_class,
                "trailing": self.trailing}
