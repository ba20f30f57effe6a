"""Grading a response against a ground-truth answer, for evaluation."""

from __future__ import annotations

from typing import Literal

from evolrl.rewards.answers import extract_answer, extract_choice
from evolrl.rewards.equivalence import answers_equivalent

Grader = Literal["math", "choice"]


def grade(response: str, truth: str, grader: Grader = "math") -> tuple[str | None, bool]:
    """``(extracted answer, is it correct)``.

    ``math``: the last boxed answer (or the last number), mathematically equivalent to the truth.
    ``choice``: a multiple-choice letter from the last box (GPQA), equal to the truth letter.
    """
    if grader == "math":
        answer = extract_answer(response)
        return answer, answers_equivalent(answer, truth)
    if grader == "choice":
        answer = extract_choice(response)
        return answer, answer is not None and answer == truth.strip().upper()
    raise ValueError(f"unknown grader {grader!r}; choose 'math' or 'choice'")
