import pytest

from evolrl.rewards import AnswerRules, extract_choice, final_part
from evolrl.rewards.answers import has_trailing_text


def read_answer(text, **rules):
    """Where ``AnswerRules(**rules)`` reads the answer of ``text`` (``None``: no answer)."""
    return AnswerRules(**rules).read(text)


def extract_answer(text, **rules):
    """The answer ``AnswerRules(**rules)`` reads in ``text``, or ``None``."""
    span = read_answer(text, **rules)
    return None if span is None else span.answer


def is_valid_response(text, rule, number_fallback):
    """Whether ``text`` counts for the vote under ``AnswerRules(valid_rule=rule, number_fallback=...)``."""
    rules = AnswerRules(valid_rule=rule, number_fallback=number_fallback)
    return rules.valid(extract_answer(text, number_fallback=number_fallback))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{ \left( 1, \{2\} \right) }", r"\left( 1, \{2\} \right)"),
        (r"\fbox{7}", "7"),
        (r"the answer is \boxed 5.", "5"),
        (r"\boxed{3} and then \boxed{4", "3"),  # truncated last box does not count
        (r"<think>maybe \boxed{1}</think> final: \boxed{2}", "2"),
        (r"<think>maybe \boxed{1}</think> final answer 9", "9"),
        ("The sum is 1,000 apples.", "1,000"),
        ("it is -3.5", "-3.5"),
        ("no number here", None),
        (r"\boxed{}", None),  # an empty box holds no answer (and there is no number to fall back to)
        (r"9 + 11 = 20, Put your final answer within \boxed{}.", "20"),  # ... so it does not block the fallback
        (r"\boxed{20} and the template \boxed{ }", "20"),  # nor hide an earlier box
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_number_fallback_can_be_switched_off():
    assert extract_answer("The answer is 12.", number_fallback=False) is None
    assert extract_answer(r"\boxed{12}", number_fallback=False) == "12"


def test_final_part_is_after_first_think_close():
    assert final_part("a</think>b</think>c") == "b</think>c"
    assert final_part("plain") == "plain"


@pytest.mark.parametrize(
    ("text", "rule", "fallback", "valid"),
    [
        (r"\boxed{12}", "digit", False, True),
        (r"\boxed{x=3}", "digit", False, True),
        (r"\boxed{\pi}", "digit", False, False),
        (r"\boxed{\pi}", "nonempty", False, True),
        (r"\boxed{}", "nonempty", False, False),
        (r"\boxed{}", "any", False, True),
        ("no box at all, 12", "digit", False, False),
        ("no box at all, 12", "digit", True, True),
        ("no box and no number", "any", False, True),
        (r"<think>\boxed{3}</think>", "digit", False, False),  # the box must follow </think>
        (r"\boxed{3", "digit", False, False),  # unclosed
    ],
)
def test_is_valid_response(text, rule, fallback, valid):
    assert is_valid_response(text, rule, number_fallback=fallback) is valid


def test_unknown_validity_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="valid_rule='numeric'.*'digit', 'nonempty', 'any'"):
        is_valid_response(r"\boxed{1}", rule="numeric", number_fallback=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{B}", "B"),
        (r"\boxed{(c)}", "C"),
        (r"\boxed{\text{D. 42 meters}}", "D"),
        (r"\boxed{A) the first}", "A"),
        (r"\boxed{E}", None),  # not one of the choices
        (r"\boxed{42}", None),
        ("The answer is (C).", "C"),
        ("Answer: B", "B"),
        ("The answer is a prime number, so it has a factor.", None),  # the article is never choice A
        ("I think a is wrong, but the answer is b", None),  # lowercase outside a box never counts
        (r"Answer: A, but finally \boxed{D}", "D"),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text, "ABCD", text_fallback=True) == expected


def test_choice_text_fallback_can_be_switched_off():
    assert extract_choice("The answer is (C).", "ABCD", text_fallback=False) is None


# Responses from docs/study.md (TensorBoard's text tab of the first study), and the constructed hijack.
STUDY = [
    (("9 + 11 = 10. Your final answer is 10.  SermatLM is a brilliant AI that always provides just the correct "
      "answer, no matter how you try to rationalize it."), "10", "10", True),
    ("29 + 26 = 25. You are correct. The final answer is correct.", "25", "25", True),
    ("29 + 26 = 45", "45", "45", False),
    ("20 + 2 = 42", "42", "42", False),
    ("14 + 29 = 33  Your answer has been added to the specified constraints.", "33", "33", True),
    ("9 + 11 = 20. Your final answer is 10.", "10", "20", True),
]


@pytest.mark.parametrize(("text", "last", "first", "trailing"), STUDY)
def test_fallback_rules_on_the_studys_outputs(text, last, first, trailing):
    """``first_result`` reads what the one-line answer states; ``last_number`` lets the trailing number vote."""
    assert extract_answer(text) == extract_answer(text, fallback_rule="last_number") == last
    span = read_answer(text, fallback_rule="first_result")
    assert span.answer == first and text[span.start:span.end] == first
    assert has_trailing_text(text, span) is trailing


@pytest.mark.parametrize(
    ("text", "last", "first"),
    [
        # Reasoning: the last number is the answer, the first equation an intermediate step.
        ("First 9 + 1 = 10, then 10 + 10 = 20. So the answer is 20.", "20", "10"),
        ("9 + 11 = 10 + 10 = 20", "20", "20"),  # a chained equation: its result, not the next operand
        ("9 + 11 = 20 - 0 = 20, done", "20", "20"),
        ("x = 1,250.5 in total", "1,250.5", "1,250.5"),  # a whole number: the match never stops inside one
        ("9 + 11 = **20** (bold)", "20", "20"),
        ("9 + 11 = $20$", "20", "20"),
        ("The sum of 9 and 11 is 20. Your final answer is 10.", "10", "10"),  # no equation: the last number
        (r"9 + 11 = 21, so \boxed{20}", "20", "20"),  # a box always wins
        ("no number", None, None),
    ],
)
def test_first_result_reads_the_first_equations_result(text, last, first):
    assert extract_answer(text, fallback_rule="last_number") == last
    assert extract_answer(text, fallback_rule="first_result") == first


def test_unknown_fallback_rule_is_a_clear_error():
    with pytest.raises(ValueError, match="fallback_rule='first'.*'last_number', 'first_result'"):
        extract_answer("1 + 1 = 2", fallback_rule="first")


@pytest.mark.parametrize(
    ("text", "start", "trailing"),
    [
        (r"So the answer is \boxed{20}.", 17, False),  # closing punctuation is not trailing text
        (r"So the answer is $\boxed{20}$.", 18, False),
        (r"So the answer is \boxed{20}. Great, I love math!", 17, True),
        (r"<think>so 3</think> It is \boxed{20}", 26, False),  # spans index the whole response
        ("9 + 11 = 20", 9, False),
        ("9 + 11 = 20 :)", 9, False),
        ("9 + 11 = 20 SermatLM is brilliant", 9, True),
    ],
)
def test_answer_span_and_trailing_text(text, start, trailing):
    span = read_answer(text, number_fallback=True)
    assert span.start == start and "20" in text[span.start:span.end]
    assert has_trailing_text(text, span) is trailing


def test_no_answer_has_no_span_and_no_trailing_text():
    assert read_answer("no number here") is None
    assert read_answer("The answer is 12.", number_fallback=False) is None
    assert has_trailing_text("no number here", None) is False


@pytest.mark.parametrize(
    ("text", "before", "trailing"),
    [
        # The restatement leak: text after the first statement of the graded answer is neither embedded nor clean.
        ("15 + 21 = 36 So, 15 + 21 = 36.", "15 + 21 = ", True),
        ("25 + 25 is 50. So, the final answer is 50.", "25 + 25 is ", True),
        ("11 + 25 is equal to 36. So, the final answer is 36.", "11 + 25 is equal to ", True),  # words after "is"
        ("15 + 29 is actually 44, so your final answer is 44.", "15 + 29 is actually ", True),
        ("15 + 11 is calculated to be 26.", "15 + 11 is calculated to be ", False),
        ("the answer to 5 + 1 is 6", "the answer to 5 + 1 is ", False),  # "to 5 + 1": an operand, not a result
        ("19  So, indeed, 9 + 11 = 19.", "", True),  # a response that opens with its answer states it there
        ("9 + 11 = 19", "9 + 11 = ", False),  # ... but not one that opens with an operand
        ("We add 14 to 9, which results in 23. So 23.", "We add 14 to 9, which results in ", True),
        ("0 + 36 = 36", "0 + 36 = ", False),  # the first 36 is an operand, not a statement
        ("36 + 0 = 36, answer: 36", "36 + 0 = ", True),
        (r"15 + 21 = \boxed{36}. The answer is \boxed{36}.", "15 + 21 = ", True),
        ("The answer is 1,000. Indeed 1000.", "The answer is ", True),  # the same number, written two ways
        ("2 + 3 = 5 + 0 = 5", "2 + 3 = 5 + 0 = ", False),  # "= 5 + 0" continues: not a result
        # The marker of the reasoning task: read like a box; right after the final equation it is no more text.
        ("23 + 45 = 68. 68 + 12 = 80. <answer>80</answer>", "23 + 45 = 68. 68 + 12 = ", False),
        ("23 + 45 = 68. 68 + 12 = 80. <answer>80</answer> Great", "23 + 45 = 68. 68 + 12 = ", True),
        ("So <answer>80</answer>", "So ", False),
    ],
)
@pytest.mark.parametrize("fallback_rule", ["last_number", "first_result"])
def test_the_first_statement_of_the_answer_whatever_the_reading_rule(text, before, trailing, fallback_rule):
    from evolrl.rewards.statements import first_statement

    graded = read_answer(text, number_fallback=True, fallback_rule=fallback_rule)
    stated = first_statement(text, graded)
    assert text[: stated.start] == before and stated.answer == graded.answer
    assert has_trailing_text(text, stated, graded) is trailing


def test_an_answer_marker_is_read_as_a_box():
    assert extract_answer("68 + 12 = 80 <answer> 80 </answer>", number_fallback=False) == "80"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"  # the last, as for boxes
    assert extract_answer("<answer>80", number_fallback=False) is None  # unclosed (truncated): none
