"""WordProblems: seeded stories whose answers a reader recomputes from the text."""

import re

import pytest

from evolrl.data import WordProblems
from evolrl.settings import SettingError

# The test's own reading of a story: which verbs take away (the module's LOSSES are not imported, so a story
# whose wording and arithmetic disagree fails here).
TAKE = ("gives away", "loses", "uses")
GIVE = ("buys", "finds", "gets")


def recompute(question: str) -> tuple[int, int]:
    """The count a story ends with, and its number of steps, read from its sentences."""
    sentences = [s for s in re.split(r"(?<=[.?])\s+", question) if s]
    total = int(re.fullmatch(r"\w+ has (\d+) \w+\.", sentences[0]).group(1))
    steps = 0
    for sentence in sentences[1:]:
        if sentence.startswith("How many"):
            break
        n = int(re.search(r"\d+", sentence).group())
        take, give = any(v in sentence for v in TAKE), any(v in sentence for v in GIVE)
        assert take != give, sentence
        assert not (take and n > total), f"takes {n} of {total}: {question}"
        total += -n if take else n
        steps += 1
    return total, steps


@pytest.mark.parametrize(("steps", "max_number"), [(1, 9), (2, 9), (3, 9), (2, 20)])
def test_answers_follow_from_the_story(steps, max_number):
    prompts = WordProblems(count=200, steps=steps, max_number=max_number, seed=3).load()
    assert len(prompts) == 200 and len({p.id for p in prompts}) == 200
    kinds = set()
    for p in prompts:
        total, counted = recompute(p.question)
        assert counted == steps
        assert p.answer == str(total) and total >= 0
        assert max(map(int, re.findall(r"\d+", p.question))) <= max_number
        kinds |= {v for v in TAKE + GIVE if v in p.question}
    assert kinds == set(TAKE + GIVE)  # every wording appears in 200 stories


def test_a_seed_gives_the_same_problems_and_another_seed_others():
    first = WordProblems(count=20, seed=5, instruction="Think step by step.").load()
    assert first == WordProblems(count=20, seed=5, instruction="Think step by step.").load()
    assert [p.question for p in first] != [p.question for p in WordProblems(count=20, seed=6).load()]
    assert all(p.question.endswith("now? Think step by step.") for p in first)


@pytest.mark.parametrize(("settings", "message"), [
    ({"count": 0}, "WordProblems.count=0 is not allowed: an integer >= 1"),
    ({"steps": 0}, "WordProblems.steps=0 is not allowed: an integer >= 1"),
    ({"max_number": 0}, "WordProblems.max_number=0 is not allowed: an integer >= 1"),
    ({"seed": -1}, "WordProblems.seed=-1 is not allowed: an integer >= 0"),
    ({"steps": True}, "WordProblems.steps=True is not allowed"),
    ({"instruction": None}, "WordProblems.instruction=None is not allowed: a string"),
])
def test_bad_settings_fail_naming_the_setting(settings, message):
    with pytest.raises(SettingError, match=re.escape(message)):
        WordProblems(**settings)
