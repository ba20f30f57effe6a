import itertools
import random
from math import comb

import pytest
import torch

from evolrl.metrics import bootstrap_maj_at_k, bootstrap_pass_at_k, label_free_diagnostics, maj_at_k, pass_at_k
from evolrl.rewards import group_answers, majority_vote
from evolrl.types import RewardOutput


def test_pass_at_k_known_values():
    assert pass_at_k(32, 1, 16) == 0.5
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than k wrong samples


def test_pass_at_k_matches_enumeration():
    for n, c, k in [(6, 2, 3), (7, 1, 4), (5, 3, 2), (8, 4, 8)]:
        hits = [any(i < c for i in subset) for subset in itertools.combinations(range(n), k)]
        assert pass_at_k(n, c, k) == pytest.approx(sum(hits) / len(hits), abs=1e-12)


def test_bootstrap_pass_at_k_is_the_biased_with_replacement_value():
    assert bootstrap_pass_at_k(32, 1, 16) == pytest.approx(1 - (31 / 32) ** 16)
    assert bootstrap_pass_at_k(32, 1, 16) == pytest.approx(0.398, abs=1e-3)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def maj_by_enumeration(answers, correct, k):
    """Every ordered draw of k of the n answers, voted with majority_vote (first seen wins ties)."""
    classes = group_answers(answers)
    wins = []
    for draw in itertools.permutations(range(len(answers)), k):
        label, flags = majority_vote([answers[i] for i in draw])
        if label is None:
            wins.append(False)
            continue
        chosen = draw[flags.index(True)]
        wins.append(correct[classes.index(classes[chosen])])
    return sum(wins) / len(wins)


def test_maj_at_k_matches_enumeration():
    rng = random.Random(0)
    pool = ["1", "2", "3", r"\frac{2}{2}", None]
    for _ in range(40):
        n = rng.randint(1, 7)
        k = rng.randint(1, n)
        answers = [rng.choice(pool) for _ in range(n)]
        correct = [a in ("1", r"\frac{2}{2}") for a in answers]
        assert maj_at_k(answers, correct, k) == pytest.approx(maj_by_enumeration(answers, correct, k), abs=1e-12)


def test_maj_at_k_special_cases():
    answers = ["7"] * 20 + ["8"] * 12
    correct = [a == "7" for a in answers]
    assert maj_at_k(answers, correct, 1) == pytest.approx(20 / 32)
    assert maj_at_k(answers, correct, 32) == 1.0
    # k = 2 of {7 x1, 8 x1}: a tie always; each wins half the time
    assert maj_at_k(["7", "8"], [True, False], 2) == 0.5
    assert maj_at_k([None, None], [False, False], 1) == 0.0
    assert maj_at_k([str(i) for i in range(64)], [i == 3 for i in range(64)], 16) == pytest.approx(1 / 64)
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True], 2)


def test_bootstrap_maj_at_k_approximates_with_replacement_vote():
    answers = ["1"] * 6 + ["2"] * 4
    correct = [a == "1" for a in answers]
    p = 0.6
    exact = sum(comb(3, x) * p**x * (1 - p) ** (3 - x) for x in (2, 3))  # k = 3: no ties
    assert bootstrap_maj_at_k(answers, correct, 3, samples=20000, seed=1) == pytest.approx(exact, abs=0.01)
    assert bootstrap_maj_at_k(answers, correct, 3, seed=5) == bootstrap_maj_at_k(answers, correct, 3, seed=5)


def test_label_free_diagnostics_by_hand():
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    out = RewardOutput(
        rewards=rewards,
        answers=(("7", "7", "8", None), ("3", "3", "3", "3")),
        labels=("7", "3"),
        components={
            "valid": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool(),
            "majority": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool(),
            "answer_class": torch.tensor([[0, 0, 1, -1], [0, 0, 0, 0]]),
            "novelty": torch.tensor([[0.2, 0.4, float("nan"), float("nan")], [0.0, 0.0, 0.0, 0.6]]),
        },
    )
    stats = label_free_diagnostics(out, truths=["8", None], truncated=torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]]))
    assert stats["reward_mean"] == pytest.approx(0.75)
    assert stats["reward_std"] == pytest.approx(0.4330127, abs=1e-6)
    assert stats["zero_variance_groups"] == 0.5
    assert stats["valid_rate"] == 7 / 8
    assert stats["majority_ratio"] == 6 / 8
    assert stats["distinct_answers"] == 1.5
    assert stats["novelty_mean"] == pytest.approx(1.2 / 6)
    assert stats["truncation_rate"] == 1 / 8
    assert stats["label_accuracy"] == 0.0  # prompt 0 voted 7, truth 8; prompt 1 has no truth
    # prompt 0: majority flags [1,1,0,0] vs correct [0,0,1,0] -> agree on the last one only
    assert stats["reward_accuracy"] == 0.25
    assert "label_accuracy" not in label_free_diagnostics(out)
