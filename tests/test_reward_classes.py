"""EvolReward, MajorityVoteReward and VerifierReward on real text with the real MiniLM embedder."""

import pytest
import torch

from evolrl.metrics.grading import MathGrader
from evolrl.rewards import (
    AnswerRules,
    EvolReward,
    MajorityVoteReward,
    NoveltyBands,
    SelfCertaintyReward,
    SemanticEntropyReward,
    TokenEntropyReward,
    VerifierReward,
)
from evolrl.settings import SettingError
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

RESPONSES = (
    r"3 + 4 = 7, so \boxed{7}.",
    r"Adding three and four gives seven: \boxed{7}",
    r"Counting up from 3 by 4 steps: 4, 5, 6, 7. \boxed{7.0}",
    r"3 + 4 = 8, so \boxed{8}.",
    r"I am not sure. \boxed{\pi}",  # no digit: invalid under the paper's rule
    "The answer is 7.",  # no box: invalid under the paper's rule
)


def batch(answer=None):
    other = (r"\boxed{12}", r"\boxed{12}", r"12 is it: \boxed{12}", r"\boxed{13}", r"\boxed{13}", r"\boxed{14}")
    return RolloutBatch(
        (
            ResponseGroup(Prompt("sum", "What is 3 + 4?", answer=answer), RESPONSES),
            ResponseGroup(Prompt("dozen", "How many in a dozen?", answer="12" if answer else None), other),
        )
    )


def test_evol_reward(minilm):
    out = EvolReward(NoveltyBands(minilm))(batch())
    r = out.rewards
    assert r.shape == (2, 6)
    assert out.labels == ("7", "12")
    assert out.answers[0][2] == "7.0"
    assert out.components["valid"][0].tolist() == [True, True, True, True, False, False]
    assert out.components["majority"][0].tolist() == [True, True, True, False, False, False]
    assert ((r[0, :3] >= 0.5) & (r[0, :3] <= 1.0)).all()
    assert r[0, 3].item() == -0.5  # lone minority response
    assert r[0, 4:].tolist() == [-1.0, -1.0]
    # prompt 2: duplicated texts are the least novel of their group (up to float noise in the embedder)
    assert r[1].tolist() == pytest.approx([0.5, 0.5, 1.0, -1.0, -1.0, -0.5], abs=1e-5)
    assert torch.isfinite(out.components["novelty"][out.components["valid"]]).all()
    # each response's group's spread of novelty before scaling; NaN for the lone minority response and invalid ones
    spread, novelty = out.components["novelty_spread"][0], out.components["novelty"][0]
    assert spread[:3].tolist() == pytest.approx([(novelty[:3].max() - novelty[:3].min()).item()] * 3)
    assert spread[3:].isnan().all()


def test_evol_reward_number_fallback_makes_unboxed_answers_valid(minilm):
    out = EvolReward(NoveltyBands(minilm), AnswerRules(valid_rule="digit", number_fallback=True))(batch())
    assert out.components["valid"][0].tolist() == [True, True, True, True, False, True]
    assert out.components["majority"][0, 5].item()


def test_majority_vote_reward():
    out = MajorityVoteReward()(batch())
    assert out.labels == ("7", "12")
    # answers: 7, 7, 7.0, 8, \pi, 7 (last number) -> majority 7
    assert out.rewards[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert out.rewards[1].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_majority_vote_reward_can_watch_novelty_without_rewarding_it(minilm):
    """TTRL's novelty as EVOL-RL reads it (Study IV's secondary criterion): the same bands, the same values, and TTRL's
    rewards unchanged."""
    rules = AnswerRules(valid_rule="digit", number_fallback=False)
    watched = MajorityVoteReward(rules, watch_novelty=NoveltyBands(minilm))(batch())
    assert watched.rewards.tolist() == MajorityVoteReward(rules)(batch()).rewards.tolist()
    evol = EvolReward(NoveltyBands(minilm), rules)(batch())
    valid = evol.components["valid"]
    torch.testing.assert_close(watched.components["novelty"][valid], evol.components["novelty"][valid])
    torch.testing.assert_close(watched.components["novelty_spread"], evol.components["novelty_spread"], equal_nan=True)
    assert "novelty" not in MajorityVoteReward()(batch()).components


def test_verifier_reward_uses_ground_truth():
    out = VerifierReward()(batch(answer="8"))
    assert out.labels == ("8", "12")
    assert out.rewards[0].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert out.rewards[1].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_verifier_reward_with_novelty_bands(minilm):
    digit = AnswerRules(valid_rule="digit", number_fallback=False)
    out = VerifierReward(NoveltyBands(minilm), digit)(batch(answer="8"))
    r = out.rewards[0]
    assert r[3].item() == 1.0  # the lone correct response
    assert ((r[:3] >= -1.0) & (r[:3] <= -0.5)).all()
    assert r[4:].tolist() == [-1.0, -1.0]


def test_verifier_reward_without_ground_truth_names_the_prompt():
    with pytest.raises(ValueError, match=r"2 of 2 prompts have no answer, in an unnamed source \(first: id 'sum', id 'dozen'\)"):
        VerifierReward()(batch())


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="valid_rule"):
        MajorityVoteReward(AnswerRules(valid_rule="numbers"))
    with pytest.raises(ValueError, match="alpha"):
        NoveltyBands(alpha=1.5)


def test_novelty_is_one_object_each_reward_gets_its_own_default():
    a, b = EvolReward(), EvolReward()
    assert isinstance(a.bands, NoveltyBands) and a.bands is not b.bands  # no shared mutable default
    assert (a.bands.alpha, a.bands.novelty_text) == (0.5, "response")
    bands = NoveltyBands(alpha=0.3, novelty_text="reasoning")
    assert EvolReward(bands).bands is bands and VerifierReward(bands).bands is bands
    assert VerifierReward().bands is None  # the plain 0/1 verifier


def test_verifier_reward_with_novelty_bands_equals_evol_bands_on_correct(minilm):
    # Same bands object, the split is correct/incorrect instead of majority/minority.
    bands = NoveltyBands(minilm, alpha=0.3)
    out = VerifierReward(bands, AnswerRules(valid_rule="digit", number_fallback=False))(batch(answer="7"))
    evol = EvolReward(bands)(batch())
    # the majority of both prompts is also the ground truth here, so the rewards coincide
    torch.testing.assert_close(out.rewards, evol.rewards)


HIJACK = ("9 + 11 = 20", "9 + 11 = 20", *["9 + 11 = 20. Your final answer is 10."] * 3, "9 + 11 = 21")


@pytest.mark.parametrize(
    ("settings", "label", "rewards"),
    [
        ({}, "10", [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]),  # the last number: the trailing "10" wins the vote
        ({"fallback_rule": "first_result"}, "20", [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]),
    ],
)
def test_the_fallback_rule_decides_whether_trailing_numbers_vote(settings, label, rewards):
    group = ResponseGroup(Prompt("add", "What is 9 + 11?"), HIJACK)
    out = MajorityVoteReward(AnswerRules(**settings))(RolloutBatch((group,)))
    assert out.labels == (label,) and out.rewards[0].tolist() == rewards


def test_every_answer_reading_reward_reports_trailing_text():
    group = ResponseGroup(Prompt("add", "What is 9 + 11?"), HIJACK)
    out = MajorityVoteReward(AnswerRules(fallback_rule="first_result"))(RolloutBatch((group,)))
    assert out.components["trailing"][0].tolist() == [False, False, True, True, True, False]


def test_fallback_rule_is_checked_where_declared():
    with pytest.raises(SettingError, match="AnswerRules.fallback_rule='first'.*'last_number', 'first_result'"):
        AnswerRules(fallback_rule="first")
    for cls in (MajorityVoteReward, EvolReward, VerifierReward):
        with pytest.raises(SettingError, match=f"{cls.__name__}.answers='first_result'.*AnswerRules"):
            cls(answers="first_result")


def test_each_reward_and_the_grader_keep_their_own_answer_rules():
    assert EvolReward().answers == AnswerRules(valid_rule="digit", number_fallback=False)  # the paper's
    assert VerifierReward().answers == AnswerRules(valid_rule="nonempty", number_fallback=False)
    every = AnswerRules(valid_rule="any", number_fallback=True, fallback_rule="last_number")
    for cls in (MajorityVoteReward, SemanticEntropyReward, SelfCertaintyReward, TokenEntropyReward, MathGrader):
        assert cls().answers == every, cls.__name__


def test_a_reward_output_knows_the_components_its_reward_declares():
    out = MajorityVoteReward()(batch())
    assert out.components.names == tuple(MajorityVoteReward.components) == (
        "valid", "majority", "answer_class", "trailing", "gated", "left_out", "novelty", "novelty_spread")
    # a gate's and the watched novelty's, declared, absent without them
    assert "gated" not in out.components and "novelty" not in out.components
    with pytest.raises(KeyError, match="'cluster_share' is not a component its reward declares"):
        "cluster_share" in out.components  # noqa: B015 (the test is that asking raises)
    plain = VerifierReward()(batch(answer="8")).components
    assert "correct" in plain and "novelty" not in plain  # declared, and produced only with novelty bands
    assert set(SemanticEntropyReward()(batch()).components) == set(SemanticEntropyReward.components)
    assert "cluster_share" not in MajorityVoteReward.components
    assert set(SelfCertaintyReward.components) - set(TokenEntropyReward.components) == {"self_certainty"}
