from helpers import majority_vote

from evolrl.rewards import group_answers


def test_plain_majority():
    assert majority_vote(["3", "4", "3"]) == ("3", [True, False, True])


def test_tie_goes_to_first_seen():
    assert majority_vote(["2", "3", "3", "2"]) == ("2", [True, False, False, True])
    assert majority_vote(["3", "2", "2", "3"]) == ("3", [True, False, False, True])


def test_equivalent_answers_vote_together():
    label, flags = majority_vote(["1", "2", r"\frac{4}{2}", "2.0", "1"])
    assert label == "2"
    assert flags == [False, True, True, True, False]


def test_tie_between_equivalence_classes():
    assert majority_vote(["0.5", "1", r"\frac12", "1"]) == ("0.5", [True, False, True, False])


def test_empty_answers_never_win():
    label, flags = majority_vote([None, "", " ", None, "5"])
    assert label == "5"
    assert flags == [False, False, False, False, True]


def test_no_answers():
    assert majority_vote([None, "", None]) == (None, [False, False, False])
    assert majority_vote([]) == (None, [])


def test_group_answers_numbers_classes_in_order():
    assert group_answers(["7", None, "3", "7.0", r"\frac{6}{2}", ""]) == [0, None, 1, 0, 1, None]
