"""tools.study.leak on Study II's committed run records: the figures docs/study.md's addendum reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.study.leak import after_first_statement, leak_figures, logged_responses

STUDY2 = Path(__file__).parent.parent / "results" / "study2" / "evol_until"


def test_the_text_after_a_responses_first_stated_result():
    assert after_first_statement("15 + 21 = 36 So, 15 + 21 = 36.") == " So, 15 + 21 = 36."
    assert after_first_statement("11 + 25 is equal to 36. So 36.") == ". So 36."
    assert after_first_statement("no result here") is None


def test_the_leak_figures_of_study_two_from_its_logged_responses():
    responses = logged_responses(STUDY2 / "seed0", tail=10)
    assert len(responses) == 40 and "20 + 2 = 22  So you are correct! 20 + 2 = 22" in responses  # 4 a step
    collapsed = leak_figures(STUDY2 / "seed2")  # the seed that drifted into bare answers
    assert collapsed["bare"] == 38 / 40 and collapsed["text after it"] == 0
    assert collapsed["groups agreeing"] == pytest.approx(0.575) and collapsed["label accuracy"] == pytest.approx(0.15)
    assert collapsed["novelty last"] < 0.01 and collapsed["novelty first"] > 0.1
    kept = leak_figures(STUDY2 / "seed0")
    assert kept["text after it"] == pytest.approx(kept["ending on a number"] + kept["ending in words"])
    assert kept["text after it"] > 0.9 and kept["ending on a number"] > kept["ending in words"]
