import pytest

from evolrl.rewards import answers_equivalent, normalize_answer


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (r"\frac12", "0.5"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{3}{4}", "0.75"),
        (r"\tfrac{3}{4}", r"\frac34"),
        ("025", "25"),
        ("142.0", "142"),
        ("1,000", "1000"),
        (".5", "0.5"),
        ("x = 5", "5"),
        (r"5\text{ cm}", "5"),
        ("20 ways", "20"),
        (r"90^\circ", "90"),
        (r"10\%", "10"),
        (r"\$5.00", "5"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}"),
        ("x+1", "1+x"),
        ("5.", "5"),
    ],
)
def test_equivalent(a, b):
    assert answers_equivalent(a, b)
    assert answers_equivalent(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("3", "4"),
        ("142", "1420"),
        ("0.33", r"\frac13"),
        (r"\pi", "3.14159"),
        ("(1,2)", "(2,1)"),
        ("", ""),
        (None, None),
        ("5", None),
        ("2x", "2"),
    ],
)
def test_not_equivalent(a, b):
    assert not answers_equivalent(a, b)


def test_normalization_is_idempotent():
    for s in [r"\dfrac{1}{2}", "025", r"5\text{ cm}", r"\left(1,2\right)", "x = 3", r"\frac12"]:
        once = normalize_answer(s)
        assert normalize_answer(once) == once


def test_equivalence_off_the_main_thread():
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(answers_equivalent, r"\frac{2}{4}", "0.5").result()
        assert not pool.submit(answers_equivalent, r"\frac{1}{3}", "0.5").result()
