"""GSPO, CISPO and Dr. GRPO's constant normalizer: values and gradients on hand-computed tensors, their settings'
checks, and one CLI training step with each.

Tolerances: the known-answer tests run in float64 and compare with ``torch.testing.assert_close``'s float64 default
(rtol 1e-7, atol 1e-7): the expectations are closed forms of the same few ``exp``/``log`` calls, so only the last bits
of a double differ. The aggregation sums are of a handful of small float32 numbers, exact up to float32 rounding
(``pytest.approx``'s 1e-6). The CLI steps assert only that a finite loss was logged: what they check is the wiring.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from helpers import scalars, tiny_config

from evolrl.algorithms import (
    CISPO,
    GSPO,
    ClippedSurrogate,
    ConstantNormalizer,
    SeqMeanTokenMean,
    TokenMean,
    clipped_surrogate,
)
from evolrl.cli import main
from evolrl.settings import SettingError
from evolrl.training import GRPOLoss

CONFIGS = Path(__file__).parent.parent / "configs"
F64 = torch.float64


def value_and_grad(loss_fn, logp, old, advantages, mask):
    """The per-token loss, its masks and the gradient of its masked sum in each token's ``logp``."""
    logp = logp.clone().requires_grad_(True)
    loss, masks = loss_fn(logp, old, advantages, mask)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
    return loss.detach(), masks, grad


# ---- GSPO ------------------------------------------------------------------------------------------------------------
# Four sequences of 3 tokens; the 5.0 sits where the mask is 0 and must never enter the sequence's mean.
GSPO_DELTA = torch.tensor([[2e-4, 0.0, 5.0],        # mean 1e-4: s = e^1e-4 inside [1 - 3e-4, 1 + 4e-4], A = 2
                           [1e-3, 1e-3, 1e-3],      # s = e^1e-3 > 1 + 4e-4, A = 1: clipped high
                           [-1e-3, -1e-3, 5.0],     # s = e^-1e-3 < 1 - 3e-4, A = -1: clipped low
                           [1e-3, 1e-3, 1e-3]],     # s = e^1e-3 above the range, but A = -1: not clipped
                          dtype=F64)
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
GSPO_ADV = torch.tensor([[2.0], [1.0], [-1.0], [-1.0]], dtype=F64)


def test_gspo_values_gradients_and_masks_by_hand():
    old = torch.linspace(-3.0, -0.5, 12, dtype=F64).reshape(4, 3)
    loss, masks, grad = value_and_grad(GSPO(), old + GSPO_DELTA, old, GSPO_ADV, GSPO_MASK)
    s0, s2, s3 = math.exp(1e-4), math.exp(-1e-3), math.exp(1e-3)
    expected = torch.tensor([[-2 * s0] * 3,                   # unclipped: -A s, the same on every token
                             [-1 * (1 + 4e-4)] * 3,            # max(-s, -(1 + 4e-4)) = -(1 + 4e-4)
                             [1 - 3e-4] * 3,                   # max(s, 1 - 3e-4) = 1 - 3e-4
                             [s3] * 3], dtype=F64)             # max(s, 1 + 4e-4) = s
    torch.testing.assert_close(loss, expected)
    # Each unclipped token's gradient in its own log-prob is -A s_i; a clipped sequence's tokens get none, a masked
    # token none either.
    torch.testing.assert_close(grad, torch.tensor([[-2 * s0, -2 * s0, 0.0], [0.0] * 3, [0.0] * 3, [s3] * 3],
                                                  dtype=F64))
    assert masks["clip_high"].tolist() == [[False] * 3, [True] * 3, [False] * 3, [False] * 3]
    assert masks["clip_low"].tolist() == [[False] * 3, [False] * 3, [True, True, False], [False] * 3]
    assert s2 < 1 - 3e-4  # the third row's premise


def test_gspo_takes_per_token_advantages_and_its_own_clip_range():
    # [N, L] advantages, and a wide range (0.5, 1.0): e^0.2 = 1.2214 is inside, e^0.8 = 2.2255 above 2.
    old = torch.zeros(2, 2, dtype=F64)
    logp = torch.tensor([[0.1, 0.3], [0.8, 0.8]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0], [1.0, -1.0]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, masks, grad = value_and_grad(GSPO(clip_low=0.5, clip_high=1.0), logp, old, adv, mask)
    s0, s1 = math.exp(0.2), math.exp(0.8)
    torch.testing.assert_close(loss, torch.tensor([[-s0, s0], [-2.0, s1]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-s0, s0], [0.0, s1]], dtype=F64))
    assert masks["clip_high"].tolist() == [[False, False], [True, False]]
    assert not masks["clip_low"].any()


def test_gspo_token_mean_per_sequence_is_the_sequence_level_objective():
    """With one advantage per sequence, GSPO-token under SeqMeanTokenMean is GSPO's sequence objective
    ``mean_i max(-A_i s_i, -A_i clip(s_i))`` (gradient through ``s_i`` itself): same value, same gradient."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 5, generator=g, dtype=F64) * 3
    # Sequence means near 0 (inside the range), -1e-3 or 1e-3 (outside): clipped low (A < 0) in row 1, high (A > 0)
    # in row 2; outside on the side the clip leaves alone in rows 3 and 5.
    offsets = torch.tensor([[0.0], [-1e-3], [1e-3], [1e-3], [0.0], [-1e-3]], dtype=F64)
    delta = offsets + (torch.rand(6, 5, generator=g, dtype=F64) - 0.5) * 2e-4
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0], [1] * 5, [1] * 2 + [0] * 3, [1] * 5]).bool()
    adv = torch.tensor([[1.0], [-0.5], [2.0], [-1.5], [0.7], [1.2]], dtype=F64)
    gspo = GSPO()

    a = (old + delta).requires_grad_(True)
    per_token, masks = gspo(a, old, adv, mask)
    SeqMeanTokenMean()(per_token, mask).backward()

    b = (old + delta).requires_grad_(True)
    s = torch.exp(((b - old) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))
    sequence = torch.maximum(-adv * s, -adv * s.clamp(1 - gspo.clip_low, 1 + gspo.clip_high)).mean()
    sequence.backward()

    assert masks["clip_low"].any(-1).tolist() == [False, True, False, False, False, False]
    assert masks["clip_high"].any(-1).tolist() == [False, False, True, False, False, False]
    torch.testing.assert_close(SeqMeanTokenMean()(per_token.detach(), mask), sequence.detach())
    torch.testing.assert_close(a.grad, b.grad * mask)


# ---- CISPO -----------------------------------------------------------------------------------------------------------
# Ratios r = exp(logp - old); the 9.0 sits where the mask is 0.
CISPO_RATIO = torch.tensor([[0.4, 1.5, 6.0], [0.1, 7.0, 9.0]], dtype=F64)
CISPO_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
CISPO_ADV = torch.tensor([[1.0], [-2.0]], dtype=F64)


def cispo_inputs():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -1.5]], dtype=F64)
    return old + CISPO_RATIO.log(), old


def test_cispo_weights_every_token_by_its_clipped_ratio_by_default_without_a_lower_bound():
    logp, old = cispo_inputs()
    loss, masks, grad = value_and_grad(CISPO(), logp, old, CISPO_ADV, CISPO_MASK)
    # Weights clip(r, -, 5): [0.4, 1.5, 5], [0.1, 5, 5]; value -A w, gradient -A w, also where the cap acts.
    torch.testing.assert_close(loss, torch.tensor([[-0.4, -1.5, -5.0], [0.2, 10.0, 10.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-0.4, -1.5, -5.0], [0.2, 10.0, 0.0]], dtype=F64))
    assert masks["clip_high"].tolist() == [[False, False, True], [False, True, False]]  # any sign; masked one out
    assert "clip_low" not in masks  # no lower bound, nothing to report
    # PPO's clip, on the same tokens, drops the gradient of the capped positive-advantage token.
    ppo = value_and_grad(ClippedSurrogate(clip_high=4.0, dual_clip=None), logp, old, CISPO_ADV, CISPO_MASK)[2]
    assert ppo[0, 2] == 0 and grad[0, 2] == -5.0


def test_cispo_with_a_lower_bound():
    logp, old = cispo_inputs()
    loss, masks, grad = value_and_grad(CISPO(clip_low=0.5, clip_high=1.0), logp, old, CISPO_ADV, CISPO_MASK)
    # Weights clip(r, 0.5, 2): [0.5, 1.5, 2], [0.5, 2, 2].
    torch.testing.assert_close(loss, torch.tensor([[-0.5, -1.5, -2.0], [1.0, 4.0, 4.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -1.5, -2.0], [1.0, 4.0, 0.0]], dtype=F64))
    assert masks["clip_low"].tolist() == [[True, False, False], [True, False, False]]
    assert masks["clip_high"].tolist() == [[False, False, True], [False, True, False]]


def test_cispo_takes_per_token_advantages():
    logp, old = cispo_inputs()
    adv = torch.tensor([[1.0, -1.0, 0.5], [2.0, 0.0, 1.0]], dtype=F64)
    loss, _, grad = value_and_grad(CISPO(), logp, old, adv, CISPO_MASK)
    torch.testing.assert_close(loss, torch.tensor([[-0.4, 1.5, -2.5], [-0.2, 0.0, -5.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-0.4, 1.5, -2.5], [-0.2, 0.0, 0.0]], dtype=F64))


# ---- ClippedSurrogate's default --------------------------------------------------------------------------------------
def test_the_default_policy_loss_is_unchanged():
    assert GRPOLoss().policy_loss == ClippedSurrogate() == ClippedSurrogate(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 6, generator=g, dtype=F64) * 2
    logp = old + torch.randn(4, 6, generator=g, dtype=F64) * 0.5  # ratios on both sides of every bound
    adv = torch.randn(4, 1, generator=g, dtype=F64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    loss, masks = ClippedSurrogate()(logp, old, adv, mask)
    want, want_masks = clipped_surrogate(logp, old, adv)
    torch.testing.assert_close(loss, want, rtol=0, atol=0)
    assert masks.keys() == want_masks.keys() == {"clip_low", "clip_high", "dual_clip"}
    assert all(torch.equal(masks[k], want_masks[k]) for k in masks)


# ---- ConstantNormalizer ----------------------------------------------------------------------------------------------
# Four sequences; 9 sits where the mask is 0 and must never count (as in tests/test_aggregation.py).
VALUES = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [4.0, 4.0, 4.0], [2.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_constant_normalizer_divides_by_sequences_times_the_budget():
    agg = ConstantNormalizer()
    # 1 + 2 + 3 + 4 * 3 + 2 = 20 over 4 sequences x 5 tokens of budget (not the mask's width, 3)
    normalizer = agg.normalizer(MASK, max_new_tokens=5)
    assert normalizer.item() == 20
    assert agg(VALUES, MASK, normalizer).item() == pytest.approx(20 / 20)
    assert agg(VALUES, MASK, max_new_tokens=5).item() == pytest.approx(20 / 20)
    assert agg(VALUES, MASK, 8.0).item() == pytest.approx(20 / 8)  # a passed normalizer is used as is
    # Micro-batches with the mini-batch's normalizer add up to the mini-batch: 6 / 20 + 14 / 20.
    halves = [agg(VALUES[rows], MASK[rows], normalizer) for rows in (slice(0, 2), slice(2, 4))]
    assert [h.item() for h in halves] == pytest.approx([6 / 20, 14 / 20])
    # A response's length does not divide its own tokens: one long and one short response of loss 1 per token.
    long_short = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert agg(torch.ones(2, 4), long_short, max_new_tokens=8).item() == pytest.approx(5 / 16)


def test_constant_normalizer_without_the_budget_says_what_is_missing():
    agg = ConstantNormalizer()
    with pytest.raises(ValueError, match="max_new_tokens"):
        agg.normalizer(MASK)
    with pytest.raises(ValueError, match="max_new_tokens"):
        agg(VALUES, MASK)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        agg.normalizer(MASK, max_new_tokens=0)


def test_the_other_aggregations_ignore_the_budget():
    assert TokenMean().normalizer(MASK, max_new_tokens=5).item() == 7
    assert SeqMeanTokenMean().normalizer(MASK, max_new_tokens=5).item() == 4


# ---- Settings --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("build", "message"), [
    (lambda: GSPO(clip_low=1.5), "GSPO.clip_low=1.5 is not allowed: a number in (0.0, 1.0)"),
    (lambda: GSPO(clip_low=0.0), "GSPO.clip_low=0.0 is not allowed"),
    (lambda: GSPO(clip_high=-1), "GSPO.clip_high=-1 is not allowed: a number > 0.0"),
    (lambda: CISPO(clip_high=0), "CISPO.clip_high=0 is not allowed: a number > 0.0"),
    (lambda: CISPO(clip_low=-0.1), "CISPO.clip_low=-0.1 is not allowed: a number >= 0.0"),
    (lambda: CISPO(clip_high=float("inf")), "CISPO.clip_high=inf is not allowed: a finite number"),
    (lambda: GRPOLoss(policy_loss=GSPO(clip_high=0.0)), "GSPO.clip_high=0.0 is not allowed"),
    (lambda: GRPOLoss(policy_loss=ConstantNormalizer()), "GRPOLoss.policy_loss=ConstantNormalizer() is not allowed"),
    (lambda: GRPOLoss(aggregation=CISPO()), "GRPOLoss.aggregation=CISPO(clip_low=1.0, clip_high=4.0) is not allowed"),
], ids=["GSPO.clip_low above 1", "GSPO.clip_low 0", "GSPO.clip_high", "CISPO.clip_high", "CISPO.clip_low",
        "CISPO.clip_high inf", "through GRPOLoss", "an aggregation as policy loss", "a policy loss as aggregation"])
def test_bad_settings_name_the_setting(build, message):
    with pytest.raises(SettingError) as err:
        build()
    assert message in str(err.value)


def test_the_defaults_and_the_edges_that_are_allowed():
    assert (GSPO().clip_low, GSPO().clip_high) == (3e-4, 4e-4)
    assert (CISPO().clip_low, CISPO().clip_high) == (1.0, 4.0)
    CISPO(clip_low=0.0)  # a lower bound at 1, allowed
    CISPO(clip_low=2.0)  # above 1: no lower bound, as 1
    assert GRPOLoss(policy_loss=CISPO(), aggregation=ConstantNormalizer()).as_dict()["policy_loss"] == {
        "class_path": "evolrl.algorithms.policy_loss.CISPO", "init_args": {"clip_low": 1.0, "clip_high": 4.0}}


# ---- Through the CLI -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("overlay", "policy_loss", "aggregation", "scale_by_std"), [
    ("gspo", GSPO(), SeqMeanTokenMean(), True),
    ("cispo", CISPO(), TokenMean(), True),
    ("dr_grpo", ClippedSurrogate(), ConstantNormalizer(), False),
])
def test_one_cli_training_step_with_each_overlay(tmp_path, tiny_model, monkeypatch, overlay, policy_loss,
                                                   aggregation, scale_by_std):
    """The overlay's ``model`` settings (configs/<overlay>.yaml) on the tiny model's one-step run: the classes it
    names are built, and the step trains (a finite loss logged)."""
    settings = yaml.safe_load((CONFIGS / f"{overlay}.yaml").read_text())["model"]
    monkeypatch.setattr("sys.argv", ["evolrl"])
    cli = main(["fit", "--config", str(tiny_config(tmp_path, tiny_model, steps=1, **settings))])
    loss = cli.model.update.loss
    assert loss.policy_loss == policy_loss and type(loss.policy_loss) is type(policy_loss)
    assert loss.aggregation == aggregation and type(loss.aggregation) is type(aggregation)
    assert cli.model.advantages.scale_by_std is scale_by_std
    logged = scalars(tmp_path)
    assert len(logged["train/loss"]) == 1
    assert all(math.isfinite(v) for v in logged["train/loss"] + logged["train/pg_loss"])
    assert "train/clip_high_frac" in logged


def test_a_loss_chosen_on_the_command_line_starts_from_its_own_defaults(tmp_path, tiny_model, monkeypatch):
    """After a config that sets ``ClippedSurrogate``'s clip range, ``--model.loss.policy_loss=...CISPO`` gives CISPO's
    own defaults (jsonargparse alone would carry ``clip_low`` and ``clip_high`` over), and a setting given after it
    is kept."""
    config = tiny_config(tmp_path, tiny_model, loss={"policy_loss": {
        "class_path": "evolrl.algorithms.ClippedSurrogate", "init_args": {"clip_low": 0.1, "clip_high": 0.3}}})
    monkeypatch.setattr("sys.argv", ["evolrl"])
    chosen = main(["--config", str(config), "--model.loss.policy_loss=evolrl.algorithms.CISPO"], run=False)
    assert chosen.model.update.loss.policy_loss == CISPO()
    chosen = main(["--config", str(config), "--model.loss.policy_loss", "evolrl.algorithms.GSPO",
                   "--model.loss.policy_loss.clip_high=0.001"], run=False)
    assert chosen.model.update.loss.policy_loss == GSPO(clip_high=0.001)


def test_a_clip_range_out_of_bounds_stops_fit_at_start(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = tiny_config(tmp_path, tiny_model)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--model.loss.policy_loss=evolrl.algorithms.GSPO",
              "--model.loss.policy_loss.clip_low=1.5"])
    assert "GSPO.clip_low=1.5" in capsys.readouterr().err
    assert not list(tmp_path.rglob("events.out.tfevents.*"))  # stopped before the first step
