import pytest

from evolrl.rewards import extract_answer, extract_choice, final_part, is_valid_response


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
        (r"\boxed{}", ""),
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
    with pytest.raises(ValueError, match="digit, nonempty, any"):
        is_valid_response(r"\boxed{1}", rule="numeric")


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
    assert extract_choice(text) == expected


def test_choice_text_fallback_can_be_switched_off():
    assert extract_choice("The answer is (C).", text_fallback=False) is None
