"""The sampler/trainer mismatch: weights and masks on hand-made tensors, the diagnostics, and the update with a
correction on the tiny model (normalizer, an all-masked mini-batch, micro-batch splits, nothing changed when off).

The real engine's side (vLLM's log-probs, a stale engine) is in ``tests/test_vllm.py``; two FSDP ranks in
``tests/test_distributed.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import mixed_sequences, run_update

from evolrl.algorithms import SeqMeanTokenMean, SequenceMask, TokenMean, TokenTruncate, mismatch_summary, mismatch_sums
from evolrl.algorithms.mismatch import SUMS
from evolrl.logprobs.forward import sequence_logprobs
from evolrl.logprobs.sequences import Sequences, trained_sequences
from evolrl.models import load_policy
from evolrl.training import Batching
from evolrl.training.update import GRPOLoss, GRPOUpdate
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

LN = math.log


# ---- weights and masks, by hand ------------------------------------------------------------------------------------
def test_token_weights_are_the_ratio_capped():
    delta = torch.tensor([[0.0, LN(1.5), LN(3.0), -LN(2.0), 5.0]])
    mask = torch.tensor([[True, True, True, True, False]])  # the last position is not a response token
    weights, truncated = TokenTruncate(cap=2.0).weights(delta, mask)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5, 2.0, 0.5, 1.0]]))
    assert truncated.tolist() == [[False, False, True, False, False]]
    weights, truncated = TokenTruncate(cap=4.0).weights(delta, mask)  # a higher cap: nothing truncated
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5, 3.0, 0.5, 1.0]]))
    assert not truncated.any()


def test_sequence_weights_are_the_product_of_token_ratios_masked_outside_both_bounds():
    mask = torch.tensor([[True, True, False], [True, True, True], [True, True, False], [False, False, False]])
    delta = torch.tensor([
        [LN(2.0) / 2, LN(2.0) / 2, 9.0],  # product 2 (the non-response 9 is ignored): kept, weight 2
        [LN(2.0), LN(2.0), 0.0],  # product 4 > 3: masked (upper bound)
        [-LN(2.0), -LN(2.0), 0.0],  # product 0.25: kept without a lower bound, masked below 0.5
        [7.0, 7.0, 7.0],  # no response tokens: ratio 1, kept
    ])
    weights, hit = SequenceMask(low=0.0, high=3.0).weights(delta, mask)
    assert weights.shape == (4, 1)
    torch.testing.assert_close(weights[:, 0], torch.tensor([2.0, 0.0, 0.25, 1.0]))
    assert hit.tolist() == [[False] * 3, [True] * 3, [False] * 3, [False] * 3]  # every token of a masked sequence
    weights, hit = SequenceMask(low=0.5, high=3.0).weights(delta, mask)
    torch.testing.assert_close(weights[:, 0], torch.tensor([2.0, 0.0, 0.0, 1.0]))
    assert hit.tolist() == [[False] * 3, [True] * 3, [True, True, False], [False] * 3]  # hit only inside the mask
    overflow = torch.full((1, 3), 100.0)  # exp(300) is inf in float32: above any bound
    assert SequenceMask().weights(overflow, torch.ones(1, 3, dtype=torch.bool))[0].item() == 0.0


def test_each_correction_through_the_loss_settings():
    delta = torch.tensor([[LN(3.0), 0.0], [0.1, 0.1]])
    mask = torch.tensor([[True, True], [True, False]])
    seqs = Sequences(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), response_mask=mask,
                     advantages=torch.zeros(2), sampler_logprobs=-delta)  # old log-probs 0: old - sampler = delta
    old = torch.zeros(2, 2)
    weights, (sums, _) = GRPOLoss().correct(old, seqs)
    assert weights is None and sums[SUMS.index("hit_tokens")] == 0
    weights, (sums, _) = GRPOLoss(mismatch_correction=TokenTruncate(cap=2.0)).correct(old, seqs)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 1.0], [math.exp(0.1), 1.0]]))
    assert sums[SUMS.index("hit_tokens")] == 1
    weights, (sums, _) = GRPOLoss(mismatch_correction=SequenceMask(high=2.5)).correct(old, seqs)
    torch.testing.assert_close(weights, torch.tensor([[0.0], [math.exp(0.1)]]))
    assert sums[SUMS.index("hit_tokens")] == 2 and sums[SUMS.index("hit_sequences")] == 1  # tokens inside the mask


def test_the_diagnostics_by_hand():
    delta = torch.tensor([[0.5, -0.5, 0.0], [LN(4.0), 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    k3 = lambda d: math.exp(d) - 1 - d
    expected_kl = (k3(0.5) + k3(-0.5) + 0 + k3(LN(4.0))) / 4
    for correction, extra in [
        (None, {}),
        (TokenTruncate(), {"weight_mean": (math.exp(0.5) + math.exp(-0.5) + 1 + 2) / 4, "truncated_token_frac": 0.25}),
        (SequenceMask(), {"weight_mean": (1.0 * 3 + 0) / 4, "masked_seq_frac": 0.5, "masked_token_frac": 0.25}),
    ]:
        weights, hit = correction.weights(delta, mask) if correction else (None, torch.zeros_like(mask))
        summary = mismatch_summary(*mismatch_sums(delta, mask, weights=weights, hit=hit), correction)
        expected = {"gap_mean": (0.5 + 0.5 + 0 + LN(4.0)) / 4, "gap_max": LN(4.0), "kl": expected_kl,
                    "ratio_max": 4.0, **extra}
        assert summary.keys() == expected.keys(), correction
        for key, value in expected.items():
            assert summary[key] == pytest.approx(value, rel=1e-6), (correction, key)


def test_an_all_masked_batch_and_an_empty_one_divide_by_nothing_zero():
    delta = torch.full((2, 3), 2.0)  # every sequence's ratio e^6 or e^2 > 1.5
    mask = torch.tensor([[True, True, True], [True, False, False]])
    correction = SequenceMask(high=1.5)
    weights, hit = correction.weights(delta, mask)
    assert weights.sum() == 0
    summary = mismatch_summary(*mismatch_sums(delta, mask, weights=weights, hit=hit), correction)
    assert summary["masked_seq_frac"] == summary["masked_token_frac"] == 1.0 and summary["weight_mean"] == 0.0
    empty = torch.zeros(1, 1, dtype=torch.bool)  # a filler pass alone: no response token anywhere
    weights, hit = correction.weights(torch.zeros(1, 1), empty)
    sums, maxima = mismatch_sums(torch.zeros(1, 1), empty, weights=weights, hit=hit)
    assert sums.sum() == 0 and mismatch_summary(sums, maxima, correction) == {}


# ---- the sampler's log-probs through packing -------------------------------------------------------------------------
def test_trained_sequences_align_the_sampler_logprobs_with_the_response_mask():
    groups = (ResponseGroup(Prompt("a", "q"), ("x", "y"), prompt_ids=(5, 6, 7), response_ids=((8, 9), (10,)),
                            sampler_logprobs=((-0.1, -0.2), (-0.3,))),
              ResponseGroup(Prompt("b", "q"), ("x", "y"), prompt_ids=(5,), response_ids=((11, 12, 13), (14, 15)),
                            sampler_logprobs=((-0.4, -0.5, -0.6), (-0.7, -0.8))))
    batch = RolloutBatch(groups, trained=torch.tensor([[1, 0], [0, 1]]))
    seqs = trained_sequences(batch, torch.zeros(2, 2), pad_id=0)
    assert seqs.sampler_logprobs.shape == seqs.response_mask.shape == (4, 4)
    assert seqs.sampler_logprobs[seqs.response_mask].tolist() == pytest.approx(
        [-0.3, -0.1, -0.2, -0.4, -0.5, -0.6, -0.7, -0.8])  # row by row: a's 1, a's 0, b's 0, b's 1
    assert (seqs.sampler_logprobs[~seqs.response_mask] == 0).all()
    part = seqs.select([3, 0])  # trimmed to their own longest (4 tokens: 3 targets)
    torch.testing.assert_close(part.sampler_logprobs, torch.tensor([[-0.7, -0.8, 0.0], [0.0, 0.0, -0.3]]))
    assert Sequences.filler(torch.device("cpu"), sampler_logprobs=True).sampler_logprobs.tolist() == [[0.0]]
    assert Sequences.filler(torch.device("cpu")).sampler_logprobs is None
    assert trained_sequences(RolloutBatch(tuple(ResponseGroup(g.prompt, g.texts, prompt_ids=g.prompt_ids,
                                                 response_ids=g.response_ids) for g in groups),
                             trained=batch.trained), torch.zeros(2, 2), 0).sampler_logprobs is None
    mixed = RolloutBatch((groups[0], ResponseGroup(groups[1].prompt, groups[1].texts, prompt_ids=(5,),
                                                   response_ids=groups[1].response_ids)), trained=batch.trained)
    with pytest.raises(ValueError, match="prompt 'b': the rollout engine reported sampler log-probs for some groups"):
        trained_sequences(mixed, torch.zeros(2, 2), 0)
    short = RolloutBatch((ResponseGroup(groups[0].prompt, groups[0].texts, prompt_ids=(5,),
                                        response_ids=((8, 9), (10,)), sampler_logprobs=((-0.1,), (-0.3,))),),
                         trained=torch.tensor([[0]]))
    with pytest.raises(ValueError, match="prompt 'a', response 0: 1 sampler log-probs for 2 tokens"):
        trained_sequences(short, torch.zeros(1, 1), 0)


# ---- the update with a correction, on the tiny model -----------------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


def with_sampler(policy, seqs: Sequences, delta: torch.Tensor, temperature: float = 0.7) -> Sequences:
    """``seqs`` with sampler log-probs ``old - delta`` at the response tokens, ``old`` the policy's own: so that
    ``old - sampler`` is ``delta`` (what the engine would report if it were off by that much)."""
    with torch.no_grad():
        old = sequence_logprobs(policy, seqs, temperature=temperature, chunk_size=16)[0]
    return Sequences(seqs.input_ids, seqs.attention_mask, response_mask=seqs.response_mask, advantages=seqs.advantages,
                     sampler_logprobs=torch.where(seqs.response_mask, old - delta, 0.0))


def sgd_update(tiny_model, seqs, mini_batch_size, **loss):
    policy = load_policy(tiny_model)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(**{"kl_coef": 0.0, **loss}),
                        Batching(mini_batch_size=mini_batch_size, micro_batch_size=3, logprob_chunk_size=16), 1e6)
    stats = update(policy, None, seqs, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
    return stats, {n: p.detach().clone() for n, p in policy.named_parameters()}


def test_masked_sequences_keep_their_tokens_in_the_normalizer(tiny_model, policy):
    """One mini-batch, so the ratio to the old policy is 1 and each token's loss is -A: the policy-gradient loss is
    sum_i w_i (-A_i) L_i / sum_i L_i, the masked sequences' tokens still counted below the line (TRL's normalizer)."""
    seqs = mixed_sequences(policy.config.vocab_size)
    lengths = seqs.response_mask.sum(-1).float()  # L_i
    ratios = torch.tensor([1.0, 2.0, 0.5, 5.0, 1.2, 0.1, 3.5, 0.9])  # > 3 is masked: rows 3 and 6
    delta = (ratios.log() / lengths)[:, None].expand_as(seqs.response_mask)  # the same share on every token
    stats, _ = sgd_update(tiny_model, with_sampler(policy, seqs, delta), 8, mismatch_correction=SequenceMask(),
                          entropy_coef=0.0)
    weights = torch.where(ratios > 3.0, 0.0, ratios)
    expected = float((weights * -seqs.advantages * lengths).sum() / lengths.sum())
    assert stats["pg_loss"] == pytest.approx(expected, rel=1e-4)
    assert stats["mismatch/masked_seq_frac"] == 0.25
    assert stats["mismatch/masked_token_frac"] == pytest.approx(float(lengths[[3, 6]].sum() / lengths.sum()))
    assert stats["mismatch/ratio_max"] == pytest.approx(float(5.0 ** (1 / lengths[3])), rel=1e-4)  # largest token's


@pytest.mark.parametrize("aggregation", [TokenMean(), SeqMeanTokenMean()], ids=repr)
def test_an_all_masked_mini_batch_moves_nothing_and_divides_by_no_zero(tiny_model, policy, aggregation):
    seqs = mixed_sequences(policy.config.vocab_size)
    stale = with_sampler(policy, seqs, torch.full(seqs.response_mask.shape, 0.5))  # every sequence's ratio > e^2
    stats, params = sgd_update(tiny_model, stale, 4, mismatch_correction=SequenceMask(), entropy_coef=0.0,
                               aggregation=aggregation)
    assert stats["pg_loss"] == 0.0 and stats["loss"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["mismatch/masked_seq_frac"] == 1.0 and stats["mismatch/weight_mean"] == 0.0
    initial = dict(policy.named_parameters())
    assert all(torch.equal(value, initial[name]) for name, value in params.items())


def test_no_correction_measures_and_changes_nothing(tiny_model, policy):
    seqs = mixed_sequences(policy.config.vocab_size)
    stats, params = sgd_update(tiny_model, with_sampler(policy, seqs, torch.full(seqs.response_mask.shape, 0.3)), 4)
    plain_stats, plain_params = sgd_update(tiny_model, seqs, 4)  # no sampler log-probs: no diagnostics
    assert {k: v for k, v in stats.items() if not k.startswith("mismatch/")} == plain_stats
    assert all(torch.equal(value, plain_params[name]) for name, value in params.items())
    assert set(stats) - set(plain_stats) == {"mismatch/gap_mean", "mismatch/gap_max", "mismatch/kl",
                                             "mismatch/ratio_max"}
    assert stats["mismatch/gap_mean"] == pytest.approx(0.3, rel=1e-4)
    assert stats["mismatch/ratio_max"] == pytest.approx(math.exp(0.3), rel=1e-4)


def test_a_correction_without_sampler_logprobs_is_an_error(tiny_model, policy):
    seqs = mixed_sequences(policy.config.vocab_size)
    with pytest.raises(ValueError, match=r"mismatch_correction=TokenTruncate\(cap=2.0\) needs the sampler's log-probs"):
        sgd_update(tiny_model, seqs, 4, mismatch_correction=TokenTruncate())


@pytest.mark.parametrize("correction", [TokenTruncate(), SequenceMask()], ids=repr)
def test_token_budget_and_packing_give_the_fixed_count_corrected_update(tiny_model, policy, correction):
    """The weights depend only on a sequence's own tokens, and sequences never span micro-batches: the corrected
    update is the same for every split (two mini-batches, KL to the reference)."""
    plain = mixed_sequences(policy.config.vocab_size)
    delta = 0.4 * torch.randn(plain.response_mask.shape, generator=torch.Generator().manual_seed(2))
    seqs = with_sampler(policy, plain, delta)
    settings = {"count": {"micro_batch_size": 2},
                "budget packed": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45, "packed": True},
                "budget": {"micro_batch_size": 1, "max_tokens_per_micro_batch": 45}}
    loss = {"mismatch_correction": correction}
    runs = {name: run_update(tiny_model, seqs, loss=loss, **s) for name, s in settings.items()}
    _, expected_stats, expected = runs["count"]
    hit = "truncated_token_frac" if isinstance(correction, TokenTruncate) else "masked_seq_frac"
    assert 0 < expected_stats[f"mismatch/{hit}"] < 1  # some tokens or sequences were corrected, not all
    _, uncorrected_stats, _ = run_update(tiny_model, seqs, micro_batch_size=2)
    assert abs(uncorrected_stats["pg_loss"] - expected_stats["pg_loss"]) > 1e-3  # the correction did something
    for name, (_, stats, params) in runs.items():
        assert stats.keys() == expected_stats.keys()
        for key, value in expected_stats.items():
            assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (name, key)
        for param, value in expected.items():
            torch.testing.assert_close(params[param], value, rtol=1e-6, atol=1e-8, msg=f"{name}: {param}")

    def with_fillers(plan):  # what a rank with fewer passes runs (plan.lockstep): exactly nothing more
        return lambda s: [[[], *mini, []] for mini in plan(s)]

    _, padded_stats, padded = run_update(tiny_model, seqs, with_fillers, loss=loss, **settings["budget packed"])
    _, budget_stats, budget = runs["budget packed"]
    assert padded_stats == budget_stats
    assert all(torch.equal(padded[name], value) for name, value in budget.items())
