"""The other label-free methods: self-certainty (Intuitor), token entropy (RENT), semantic entropy (EMPO).

Known answers on hand-made numbers, the policy pass against a direct computation on the tiny model, the update
with that pass equal to the update without it, and a CLI run of each reward on the tiny model.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import scalars, short_sequences, tiny_config

from evolrl.cli import main
from evolrl.models import load_policy
from evolrl.rewards import (
    PolicySignal,
    RewardContext,
    SelfCertaintyReward,
    SemanticEntropyReward,
    TokenEntropyReward,
)
from evolrl.types import Prompt, ResponseGroup, RolloutBatch


def batch(texts: list[list[str]], trained: list[list[int]]) -> RolloutBatch:
    groups = tuple(ResponseGroup(Prompt(f"p{i}", "What is 1 + 2?", "3"), tuple(row)) for i, row in enumerate(texts))
    return RolloutBatch(groups, weights_version=0, trained=torch.tensor(trained))


# ---- known answers -------------------------------------------------------------------------------------------------
def test_the_policy_signal_is_the_mean_over_each_responses_tokens():
    mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False], [True, True, True]])
    logp = torch.tensor([[-1.0, -3.0, 9.0], [-0.5, 9.0, 9.0], [9.0, 9.0, 9.0], [-1.0, -2.0, -3.0]])
    entropy = torch.tensor([[1.0, 2.0, 9.0], [0.5, 9.0, 9.0], [9.0, 9.0, 9.0], [3.0, 3.0, 3.0]])
    vocabulary = 8
    uniform = -math.log(vocabulary)  # the mean log-prob of a uniform distribution: self-certainty 0
    mean_logp = torch.tensor([[uniform, uniform - 1.0, 9.0], [uniform - 2.0, 9.0, 9.0], [9.0] * 3, [uniform] * 3])
    signal = PolicySignal.from_tokens(torch.tensor([[0, 2], [1, 0]]), mask, logp=logp, entropy=entropy,
                                      mean_logp=mean_logp, vocabulary=vocabulary)
    torch.testing.assert_close(signal.logprob, torch.tensor([[-2.0, -0.5], [0.0, -2.0]]))
    torch.testing.assert_close(signal.entropy, torch.tensor([[1.5, 0.5], [0.0, 3.0]]))
    torch.testing.assert_close(signal.self_certainty, torch.tensor([[0.5, 2.0], [0.0, 0.0]]))
    # [P, G] placed at the trained responses of [P, V]; the others were not scored
    placed = signal.per_response(signal.entropy, vote_samples=3)
    assert placed[0, 0] == 1.5 and placed[0, 2] == 0.5 and placed[1, 1] == 0.0 and placed[1, 0] == 3.0
    assert placed[0, 1].isnan() and placed[1, 2].isnan()


def test_self_certainty_and_token_entropy_rewards_by_hand():
    signal = PolicySignal(trained=torch.tensor([[2, 0]]), entropy=torch.tensor([[0.5, 2.0]]),
                          self_certainty=torch.tensor([[3.0, 1.0]]), logprob=torch.tensor([[-1.0, -2.0]]))
    rollouts = batch([["It is 3.", "3", "4"]], [[2, 0]])
    certainty = SelfCertaintyReward()(rollouts, RewardContext(policy=signal))
    assert certainty.rewards[0, 2] == 3.0 and certainty.rewards[0, 0] == 1.0 and certainty.rewards[0, 1].isnan()
    entropy = TokenEntropyReward()(rollouts, RewardContext(policy=signal))
    assert entropy.rewards[0, 2] == -0.5 and entropy.rewards[0, 0] == -2.0 and entropy.rewards[0, 1].isnan()
    # the answers are read for the diagnostics (majority 3), never for the reward
    assert certainty.labels == ("3",) and certainty.components["majority"].tolist() == [[True, True, False]]
    with pytest.raises(TypeError, match="reads the policy: call it with the step's PolicySignal"):
        SelfCertaintyReward()(rollouts)


def test_semantic_entropy_reward_is_the_share_of_the_answers_cluster():
    rollouts = batch([["3", "It is 3.", "5", "no idea"], ["7", "8", "9", "10"]], [[0, 1], [0, 1]])
    out = SemanticEntropyReward()(rollouts)
    torch.testing.assert_close(out.rewards, torch.tensor([[0.5, 0.5, 0.25, 0.0], [0.25] * 4]))
    # equivalent answers are one meaning (math-verify), as in the vote
    same = SemanticEntropyReward()(batch([["\\boxed{1/2}", "\\boxed{0.5}", "\\boxed{2}", "\\boxed{2}"]], [[0, 1]]))
    torch.testing.assert_close(same.rewards, torch.tensor([[0.5, 0.5, 0.5, 0.5]]))


def test_the_diagnostics_leave_out_the_responses_a_reward_did_not_score():
    from evolrl.metrics.diagnostics import label_free_diagnostics

    signal = PolicySignal(trained=torch.tensor([[0, 1], [0, 1]]), entropy=torch.zeros(2, 2),
                          self_certainty=torch.tensor([[1.0, 3.0], [2.0, 2.0]]), logprob=torch.zeros(2, 2))
    out = SelfCertaintyReward()(batch([["3", "3", "4"], ["5", "6", "6"]], [[0, 1], [0, 1]]), RewardContext(policy=signal))
    stats = label_free_diagnostics(out)
    assert stats["reward_mean"] == 2.0 and stats["reward_std"] == pytest.approx(math.sqrt(0.5))
    assert stats["zero_variance_groups"] == 0.5  # the second group's two scored rewards are equal


# ---- the policy pass -----------------------------------------------------------------------------------------------
@pytest.fixture
def policy(tiny_model):
    return load_policy(tiny_model)


@pytest.mark.parametrize("packed", [False, True])
def test_the_policy_pass_is_the_policys_own_distribution(policy, packed):
    from evolrl.training import Batching, GRPOLoss, GRPOUpdate

    seqs = short_sequences(policy.config.vocab_size, [1.0, -1.0, 0.5, -0.5])
    update = GRPOUpdate(GRPOLoss(), Batching(mini_batch_size=2, micro_batch_size=1, logprob_chunk_size=5,
                                             max_tokens_per_micro_batch=20 if packed else None, packed=packed), 1.0)
    scored = update.policy_pass(policy, seqs, 0.7)
    with torch.no_grad():
        logq = torch.log_softmax(policy(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask).logits[:, :-1]
                                 / 0.7, dim=-1)
    mask = seqs.response_mask
    expected_logp = logq.gather(-1, seqs.input_ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(scored.logp[mask], expected_logp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scored.entropy[mask], -(logq.exp() * logq).sum(-1)[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scored.mean_logp[mask], logq.mean(-1)[mask], rtol=1e-5, atol=1e-5)
    # self-certainty = KL(U || p), computed as such
    vocabulary = logq.shape[-1]
    kl = (math.exp(-math.log(vocabulary)) * (-math.log(vocabulary) - logq)).sum(-1)
    signal = PolicySignal.from_tokens(torch.arange(4).view(2, 2), mask, logp=scored.logp, entropy=scored.entropy,
                                      mean_logp=scored.mean_logp, vocabulary=vocabulary)
    expected = (kl * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(signal.self_certainty.flatten(), expected, rtol=1e-5, atol=1e-5)


def test_an_update_given_the_policy_pass_is_the_update_without_it(tiny_model):
    from evolrl.training import Batching, GRPOLoss, GRPOUpdate

    results = []
    for with_pass in (False, True):
        policy = load_policy(tiny_model)
        reference = load_policy(tiny_model).eval().requires_grad_(False)
        seqs = short_sequences(policy.config.vocab_size, [1.0, -1.0, 0.5, -0.5])
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        update = GRPOUpdate(GRPOLoss(), Batching(mini_batch_size=2, micro_batch_size=1, logprob_chunk_size=7), 1.0)
        scored = update.policy_pass(policy, seqs, 0.7) if with_pass else None
        calls, forward = [], update.forward

        def counting(model, part, temperature, calls=calls, forward=forward, policy=policy, **kwargs):
            calls.append(model is policy and not torch.is_grad_enabled())
            return forward(model, part, temperature=temperature, **kwargs)

        update.forward = counting
        given = replace(seqs, old_logprobs=scored.logp) if with_pass else seqs
        stats = update(policy, reference, given, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
        # Without the pass the second mini-batch's old log-probs take one no-grad pass (micro-batches of one, no-grad
        # passes of two: Batching.no_grad_pass_multiple); with it, none: the update reads them from the pass.
        assert sum(calls) == (0 if with_pass else 1)
        results.append((stats, {k: v.detach().clone() for k, v in policy.state_dict().items()}))
    (plain, before), (given, after) = results
    # Not bit-equal: the pass computes the first mini-batch's old log-probs in a no-grad pass of two rows, the plain
    # update takes them from its own one-row pass, and float32 matmuls of other shapes round otherwise: measured, the
    # stats differ by 9e-8 relative and the parameters by 7.5e-9, where the smallest parameter's step is 5.7e-5.
    assert plain.keys() == given.keys() and all(plain[k] == pytest.approx(given[k], rel=1e-5) for k in plain)
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=1e-5, atol=1e-7, msg=name)


# ---- through the CLI -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["self_certainty", "token_entropy", "semantic_entropy"])
def test_a_two_step_cli_run_through_each_overlay(tmp_path, tiny_model, monkeypatch, method):
    """The method's overlay (configs/demo_<method>.yaml) on the tiny model's config, logs kept under tmp_path."""
    import yaml

    overlay = Path(__file__).parent.parent / "configs" / f"demo_{method}.yaml"
    logs = tmp_path / "logs.yaml"
    logs.write_text(yaml.safe_dump({"trainer": {"logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": str(tmp_path)}}}}))
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(tiny_config(tmp_path, tiny_model)), "--config", str(overlay), "--config", str(logs)])
    logged = scalars(tmp_path)
    assert len(logged["train/loss"]) == 2 and all(math.isfinite(v) for v in logged["train/reward_mean"])
    assert {"train/majority_ratio", "train/label_accuracy", "train/entropy"} <= logged.keys()
