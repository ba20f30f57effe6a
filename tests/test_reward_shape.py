"""tools.study.reward_shape (``python -m tools.study.study rewards``) on its constructed groups, with real MiniLM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.study.reward_shape import FAMILIES, constructed_groups, methods, shape, table

ROOT = Path(__file__).parent.parent


def mean(values):
    return sum(values) / len(values)


def test_the_report_shows_whole_response_novelty_paying_for_trailing_text(minilm):
    groups = constructed_groups()
    assert {len(texts) for _, texts in groups} == {8} and len(groups) == 7 + 6 + 5 + 4
    shapes = shape(groups, methods(minilm))
    assert set(shapes["TTRL"]) == {"8/8", "7/8", "6/8", "5/8"}
    for level, ttrl in shapes["TTRL"].items():
        assert len(ttrl["clean"]) == len(ttrl["trailing"]) > 0
        # TTRL cannot tell the two apart; a group that agrees gives no advantage at all.
        assert mean(ttrl["clean"]) == mean(ttrl["trailing"])
        whole, until = shapes["EVOL-RL whole"][level], shapes["EVOL-RL until answer"][level]
        assert mean(whole["trailing"]) > mean(whole["clean"]) + 0.3, level  # the paper's novelty pays for it
        # Until the answer every one-liner embeds "9 + 11 = ": the rewards are an affine map of TTRL's, so the
        # advantages are TTRL's (float32 reward and std arithmetic: 1e-4).
        assert mean(until["clean"]) == pytest.approx(mean(ttrl["clean"]), abs=1e-4)
        assert mean(until["trailing"]) == pytest.approx(mean(ttrl["trailing"]), abs=1e-4)
    assert mean(shapes["TTRL"]["8/8"]["clean"]) == 0.0
    assert mean(shapes["EVOL-RL whole"]["8/8"]["clean"]) < -0.3  # the clean answer is punished when all agree
    rows = table("title", shapes)
    assert "| 8/8 | 28 / 28 | +0.00 | +0.00 |" in rows and rows.count("\n| ") == 4 + 1  # header + 4 levels


@pytest.mark.parametrize("family", ["restatements ending on a number", "boxed answers restated"])
def test_until_the_answer_restatements_earn_no_more_than_the_clean_answer(minilm, family):
    """Until the answer, text after the first statement of the answer (a restatement read at its last number, a
    second box) is not embedded: at every agreement level the restated responses' mean advantage is the clean ones'
    (float32 arithmetic: 1e-4), and the trailing flag counts them."""
    clean, variants = FAMILIES[family]
    shapes = shape(constructed_groups(clean, variants), methods(minilm))
    for level, until in shapes["EVOL-RL until answer"].items():
        assert len(until["trailing"]) > 0, level  # the flag saw every restatement
        assert mean(until["trailing"]) <= mean(until["clean"]) + 1e-4, level


def test_a_negative_sample_count_fails_at_start():
    result = subprocess.run([sys.executable, "-m", "tools.study.study", "rewards", "--sample", "-1"],
                            capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 2 and "--sample -1" in result.stderr
