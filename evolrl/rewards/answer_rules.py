"""How a response's final answer is read and when it counts: one settings object for every reward and grader.

Each reward and :class:`~evolrl.metrics.grading.MathGrader` takes one :class:`AnswerRules` as ``answers``
(config keys ``model.reward.init_args.answers.*``, ``grader.init_args.answers.*``), with its own default: the
paper's EVOL-RL counts only a boxed answer with a digit, the TTRL-style rewards let every response vote, and a
verifier accepts any boxed answer. The reading itself is :mod:`evolrl.rewards.answers`.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolrl.rewards.answers import (
    FALLBACK_RULES,
    VALID_RULES,
    AnswerSpan,
    FallbackRule,
    ValidRule,
    is_valid_answer,
    read_answer,
)
from evolrl.settings import check_choice, require


@dataclass(frozen=True)
class AnswerRules:
    """Which text of a response is its final answer, and which responses count as valid."""

    valid_rule: ValidRule = "any"
    """Which responses are valid (vote, novelty): ``digit`` (paper: a boxed answer with a digit), ``nonempty``
    (any boxed answer) or ``any`` (every response)."""
    number_fallback: bool = True
    """Without a ``\\boxed{}``, read a number of the response as its answer (which then counts as boxed)."""
    fallback_rule: FallbackRule = "last_number"
    """Which number the fallback reads: ``last_number``, or ``first_result`` (the first equation's result, so text
    after a one-line answer cannot cast the vote; :mod:`evolrl.rewards.answers`)."""

    def __post_init__(self) -> None:
        check_choice("AnswerRules.valid_rule", self.valid_rule, VALID_RULES)
        require(isinstance(self.number_fallback, bool), "AnswerRules.number_fallback", self.number_fallback,
                allowed="true or false")
        check_choice("AnswerRules.fallback_rule", self.fallback_rule, FALLBACK_RULES)

    def read(self, text: str) -> AnswerSpan | None:
        """The final answer of ``text`` and where it was read; ``None`` without one."""
        return read_answer(text, self.number_fallback, self.fallback_rule)

    def valid(self, answer: str | None) -> bool:
        """Whether a read answer (``None``: none) makes its response valid."""
        return is_valid_answer(answer, self.valid_rule)


EVERY_ANSWER = AnswerRules()
"""The TTRL-style default: every response takes part, and one without a box is read by its last number."""


def check_rules(owner: str, answers: object) -> None:
    """``answers`` is an :class:`AnswerRules` (``owner``: the class that takes it, for the error)."""
    require(isinstance(answers, AnswerRules), f"{owner}.answers", answers,
            allowed="an evolrl.rewards.AnswerRules (config: a mapping of valid_rule, number_fallback, fallback_rule)")
