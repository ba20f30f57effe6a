"""Grading a response against a ground-truth answer, for evaluation.

A grader is a small class chosen by ``class_path`` (an evaluation set's ``grader``): called as
``grader(response, truth)``, it returns ``(extracted answer, is it correct)``.

* :class:`MathGrader`: the last boxed answer (or the last number), mathematically equivalent to the truth;
* :class:`ChoiceGrader`: a multiple-choice letter (GPQA), equal to the truth letter.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules, check_rules
from evolrl.rewards.answers import extract_choice
from evolrl.rewards.equivalence import answers_equivalent
from evolrl.settings import require


class Grader(ABC):
    """Grades one response: ``grader(response, truth) -> (extracted answer or None, correct)``."""

    @abstractmethod
    def __call__(self, response: str, truth: str) -> tuple[str | None, bool]:
        """``(extracted answer, is it correct)`` for ``response`` against the ground truth ``truth``."""


class MathGrader(Grader):
    """The final answer (last ``\\boxed{}``), mathematically equivalent to the truth.

    Args:
        answers: How the answer is read (its ``number_fallback`` and ``fallback_rule``; validity plays no part):
            grade with the rules the training reward reads answers with.
    """

    def __init__(self, answers: AnswerRules = EVERY_ANSWER) -> None:
        check_rules("MathGrader", answers)
        self.answers = answers

    def __call__(self, response: str, truth: str) -> tuple[str | None, bool]:
        span = self.answers.read(response)
        answer = None if span is None else span.answer
        return answer, answers_equivalent(answer, truth)


class ChoiceGrader(Grader):
    """A multiple-choice letter (GPQA) from the last box, equal to the truth letter (case-insensitive).

    Args:
        choices: The option letters, e.g. ``ABCD``.
        text_fallback: Without a box, read an explicit "answer is (C)" / "Answer: C" phrase.
    """

    def __init__(self, choices: str = "ABCD", text_fallback: bool = True) -> None:
        letters = isinstance(choices, str) and bool(choices) and all("A" <= c <= "Z" for c in choices)
        require(letters and len(set(choices)) == len(choices), "ChoiceGrader.choices", choices,
                allowed="a non-empty string of distinct capital letters, e.g. 'ABCD'")
        require(isinstance(text_fallback, bool), "ChoiceGrader.text_fallback", text_fallback, allowed="true or false")
        self.choices = choices
        self.text_fallback = text_fallback

    def __call__(self, response: str, truth: str) -> tuple[str | None, bool]:
        answer = extract_choice(response, self.choices, self.text_fallback)
        return answer, answer is not None and answer == truth.strip().upper()
