"""SCOPE (Wang et al. 2025, arXiv 2512.15146): known answers for its three parts and a run through the CLI.

The paper's formulas are cited by name, as docs/method.md 4.6 writes them: the confidence-weighted vote
``argmax_a sum_{i: a_i = a} C_i``, the average-step confidence ``C = (1/S) sum_s mean_{t in s} log p_t`` (here of
the sampled token; the paper's top-k mean needs log-probs the engines do not report), and the Pareto choice of the
subgroup size, nearest ``(1, 1)`` in ``sqrt(lam (1 - q)^2 + (1 - lam)(1 - e)^2)`` after min-max scaling over the
front (as in the authors' released trainer). Tolerances are float32 rounding of a few operations (1e-6).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_family_two import overlay_run

from evolrl.algorithms import GroupAdvantages
from evolrl.cli import main
from evolrl.rewards import Reward, RewardContext, ScopeReward
from evolrl.rewards.scope.confidence import step_bounds, vote_weight
from evolrl.rewards.scope.subgroups import Partition, pareto_choice, partition, sizes, weighted_vote
from evolrl.settings import SettingError
from evolrl.training.reward_hooks import RewardHooks
from evolrl.training.scoring import Scoring
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch
from helpers import scalars


def group(*answers: str) -> RolloutBatch:
    return RolloutBatch((ResponseGroup(Prompt("p0", "What is 7 + 8?"), tuple(f"\\boxed{{{a}}}" for a in answers)),))


def test_a_confident_minority_outvotes_an_unsure_majority():
    classes = [0] * 5 + [1] * 3  # five responses answer 12, three answer 15
    assert weighted_vote(classes, [0.5] * 5 + [1.0] * 3) == 1  # 2.5 against 3.0
    assert weighted_vote(classes, [1.0] * 8) == 0  # equal weights: the plain majority
    assert weighted_vote([None, 1, 0], [9.0, 1.0, 1.0]) == 1  # no answer has no vote; a tie goes to the first drawn
    assert weighted_vote([None, None], [1.0, 1.0]) is None


def test_a_step_ends_with_the_token_that_completes_a_blank_line():
    assert step_bounds(["So", " 3\n", "\n", "then", " 9\n\n", "end"]) == [(0, 3), (3, 5), (5, 6)]
    assert step_bounds(["one step"]) == [(0, 1)]
    assert step_bounds([]) == []


def test_the_confidence_averages_steps_not_tokens():
    logprobs, pieces = [-0.1, -0.3, -1.0, -2.0], ["a\n\n", "b", "c", "d"]  # steps: [-0.1] and [-0.3, -1.0, -2.0]
    step_mean = (-0.1 + (-0.3 - 1.0 - 2.0) / 3) / 2  # -0.6, where the tokens' mean is -0.85
    assert vote_weight(logprobs, pieces) == pytest.approx(math.exp(step_mean), abs=1e-6)
    assert vote_weight(logprobs, pieces, "surprisal") == pytest.approx(-step_mean, abs=1e-6)
    assert vote_weight([], []) == 0.0


def test_the_sizes_tried_divide_the_group():
    assert sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert sizes(16) == [1, 2, 4, 8, 16]
    assert sizes(12) == [1, 2, 4, 12]
    assert sizes(1) == [1]


def candidate(size: int, hits: int, labels: list[int]) -> Partition:
    """One prompt of 10 responses: ``hits`` of them score 1 (q = hits / 10); ``labels``' distinct count is e."""
    return Partition(size, [labels + [labels[0]] * (10 - len(labels))], torch.tensor([[1.0] * hits + [0.0] * (10 - hits)]))


def test_the_size_kept_is_on_the_pareto_front_and_nearest_its_corner():
    wide, narrow, dominated = candidate(10, 9, [0]), candidate(1, 5, [0, 1, 2]), candidate(2, 4, [0, 1])
    # front: wide (q 0.9, e 1) and narrow (q 0.5, e 3); scaled to (1, 0) and (0, 1)
    assert pareto_choice([narrow, dominated, wide], lam=0.7) is wide  # sqrt(0.3) < sqrt(0.7)
    assert pareto_choice([narrow, dominated, wide], lam=0.2) is narrow  # sqrt(0.2) < sqrt(0.8)
    assert pareto_choice([dominated, narrow], lam=1.0) is narrow  # the dominated one never wins


def test_each_subgroup_scores_its_own_label():
    classes, weights = [[0, 0, 1, 1, 0, 1, 1, 0]], torch.ones(1, 8)
    cut = partition(classes, weights, size=2, votes=3, generator=torch.Generator().manual_seed(0))
    labels = cut.labels[0]
    assert all(labels[i] == labels[i + 1] for i in range(0, 8, 2))  # one label a subgroup of 2
    assert cut.rewards[0].tolist() == [float(c == lab) for c, lab in zip(classes[0], labels)]
    again = partition(classes, weights, size=2, votes=3, generator=torch.Generator().manual_seed(0))
    assert again.labels == cut.labels  # the draws follow the generator alone


def test_the_reward_on_a_confident_minority():
    batch = group(*["12"] * 5, *["15"] * 3)
    weights = torch.tensor([[0.5] * 5 + [1.0] * 3])
    out = ScopeReward(votes=8).against(batch, weights, torch.Generator().manual_seed(0))
    # all 8 drawn: every subgroup of every size votes 15, so every size has q = 3/8 and e = 1; the first is kept
    assert out.rewards.tolist() == [[0.0] * 5 + [1.0] * 3]
    assert out.labels == ("15",)
    assert out.components["majority"].tolist() == [[False] * 5 + [True] * 3]
    assert out.components["subgroup_size"][0, 0].item() == 1.0
    assert out.components["confidence"].tolist() == weights.tolist()


def test_scope_s_settings_are_checked_where_declared_and_against_the_run():
    for key, value in (("votes", 0), ("lam", 1.5), ("weight", "entropy"), ("step_end", "")):
        with pytest.raises(SettingError, match=f"ScopeReward.{key}="):
            ScopeReward(**{key: value})
    with pytest.raises(SettingError, match="data.engine='HFEngine' is not allowed"):
        ScopeReward().check(RewardContext(settings={"engine": "HFEngine", "sampler_logprobs": False}))
    with pytest.raises(SettingError, match=r"ScopeReward.votes=32 is not allowed: at most .*vote_samples \(16\)"):
        ScopeReward(votes=32).check(RewardContext(settings={"vote_samples": 16}))


def test_a_two_step_cli_run_logs_the_subgroup_size(tmp_path, tiny_model):
    main([*overlay_run(tmp_path, tiny_model, "scope"), "--data.engine.init_args.report_logprobs", "true"])
    logged = scalars(tmp_path)
    assert len(logged["train/loss"]) == 2 and all(math.isfinite(v) for v in logged["train/loss"])
    assert all(v in (1, 2, 4) for v in logged["train/subgroup_size_mean"])  # the tiny config's V is 4
    assert {"train/majority_ratio", "train/label_accuracy"} <= logged.keys()


def test_an_engine_without_log_probs_stops_fit_at_start(tmp_path, tiny_model, capsys):
    with pytest.raises(SystemExit):
        main(overlay_run(tmp_path, tiny_model, "scope"))
    err = capsys.readouterr().err
    assert "data.engine='HFEngine' is not allowed" in err and "report_logprobs" in err
    assert not list(tmp_path.rglob("events.out.tfevents*"))  # stopped before any step


class Calls(Reward):
    """Records each call's ``(step, call)``: what a reward's per-call seeds are keyed by."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        self.seen.append((context.step, context.call))
        return RewardOutput(torch.ones(batch.num_prompts, batch.group_size),
                            answers=tuple((None,) * batch.group_size for _ in batch.groups),
                            labels=(None,) * batch.num_prompts)


def test_each_call_of_a_step_has_a_number_of_its_own_and_a_new_step_starts_at_0():
    reward = Calls()
    hooks = RewardHooks(reward)
    group = ResponseGroup(Prompt("p", "q"), texts=("a", "b"), prompt_ids=(1, 2), response_ids=((5,), (6, 7)))
    rollouts = RolloutBatch((group,), weights_version=0, trained=torch.tensor([[0, 1]]), temperature=1.0)
    for step in (3, 4):
        hooks.before_step(step)
        scoring = Scoring(reward, GroupAdvantages(), None, torch.device("cpu"), policy_pass=None, vocabulary=300,
                          context=hooks.context)
        scoring(rollouts), scoring(rollouts)  # a step with a second round (dynamic sampling)
    assert reward.seen == [(3, 0), (3, 1), (4, 0), (4, 1)]
