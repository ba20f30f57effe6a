"""Evaluation graders: known answers for MathGrader and ChoiceGrader, and the evaluation set's default."""

import pytest

from evolrl.data import AdditionPrompts, EvalSet
from evolrl.metrics.grading import ChoiceGrader, Grader, MathGrader
from evolrl.rewards import AnswerRules
from evolrl.settings import SettingError


@pytest.mark.parametrize(("response", "truth", "expected"), [
    (r"so \boxed{\frac12}.", "0.5", ("\\frac12", True)),
    (r"\boxed{7}", "8", ("7", False)),
    ("3 + 4 = 7", "7", ("7", True)),             # no box: the last number
    ("no answer here", "7", (None, False)),
])
def test_math_grader(response, truth, expected):
    assert MathGrader()(response, truth) == expected


def test_math_grader_without_number_fallback():
    assert MathGrader(AnswerRules(number_fallback=False))("3 + 4 = 7", "7") == (None, False)


def test_math_grader_reads_with_the_rewards_fallback_rule():
    hijacked = "9 + 11 = 20. Your final answer is 10."  # trailing text with a number, as in docs/study.md
    assert MathGrader()(hijacked, "20") == ("10", False)
    assert MathGrader(AnswerRules(fallback_rule="first_result"))(hijacked, "20") == ("20", True)
    with pytest.raises(SettingError, match="AnswerRules.fallback_rule='first'"):
        MathGrader(AnswerRules(fallback_rule="first"))


@pytest.mark.parametrize(("response", "truth", "expected"), [
    (r"\boxed{(b)}", "B", ("B", True)),
    (r"\boxed{\text{C. 42}}", " c ", ("C", True)),
    ("The answer is (C).", "D", ("C", False)),
    ("a cat", "A", (None, False)),                 # the article "a" is never choice A
    (r"\boxed{E}", "E", (None, False)),            # not among ABCD
])
def test_choice_grader(response, truth, expected):
    assert ChoiceGrader()(response, truth) == expected


def test_choice_grader_settings():
    assert ChoiceGrader(choices="ABCDE")(r"\boxed{E}", "E") == ("E", True)
    assert ChoiceGrader(text_fallback=False)("The answer is (C).", "C") == (None, False)


def test_an_eval_set_grades_math_unless_told_otherwise():
    assert isinstance(EvalSet(AdditionPrompts(count=2), "add").grader, MathGrader)
    choice = ChoiceGrader()
    assert EvalSet(AdditionPrompts(count=2), "gpqa", grader=choice).grader is choice
    assert isinstance(choice, Grader)
