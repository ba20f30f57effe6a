"""The loss's aggregation classes on hand-computed tensors, and the CLI choosing the aggregation and the mismatch
correction by ``class_path`` (the corrections' own math is in ``tests/test_mismatch.py``).

The numbers in the expectations are worked out from the tensors in the comments, not recorded: exact up to float32
rounding of a few small sums.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from helpers import tiny_config

from evolrl.algorithms import SeqMeanTokenMean, SequenceMask, TokenMean, TokenTruncate
from evolrl.cli import main
from evolrl.training import GRPOLoss

# Four sequences; 9 sits where the mask is 0 and must never count.
VALUES = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [4.0, 4.0, 4.0], [2.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_token_mean_by_hand():
    values, mask = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert TokenMean()(values, mask).item() == pytest.approx((1 + 2 + 3) / 3)  # 2.0
    # 1 + 2 + 3 + 4 * 3 + 2 = 20 over 2 + 1 + 3 + 1 = 7 tokens
    assert TokenMean().normalizer(MASK).item() == 7
    assert TokenMean()(VALUES, MASK).item() == pytest.approx(20 / 7)


def test_sequence_mean_of_token_means_by_hand():
    values, mask = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert SeqMeanTokenMean()(values, mask).item() == pytest.approx((1.5 + 3) / 2)  # 2.25
    # per sequence 1.5, 3, 4, 2 over 4 sequences
    assert SeqMeanTokenMean().normalizer(MASK).item() == 4
    assert SeqMeanTokenMean()(VALUES, MASK).item() == pytest.approx((1.5 + 3 + 4 + 2) / 4)


@pytest.mark.parametrize(("aggregation", "whole", "own_normalizers"), [
    # rows 0-1 sum to 1 + 2 + 3 = 6 over 3 tokens, rows 2-3 to 12 + 2 = 14 over 4: per pass 6/3 + 14/4
    (TokenMean(), 20 / 7, 6 / 3 + 14 / 4),
    # rows 0-1 give 1.5 + 3 = 4.5 over 2 sequences, rows 2-3 give 4 + 2 = 6 over 2
    (SeqMeanTokenMean(), 10.5 / 4, 4.5 / 2 + 6 / 2),
], ids=repr)
def test_micro_batches_with_the_mini_batch_normalizer_sum_to_the_mini_batch(aggregation, whole, own_normalizers):
    normalizer = aggregation.normalizer(MASK)
    halves = [aggregation(VALUES[rows], MASK[rows], normalizer) for rows in (slice(0, 2), slice(2, 4))]
    assert sum(halves).item() == pytest.approx(whole)
    singles = [aggregation(VALUES[i : i + 1], MASK[i : i + 1], normalizer) for i in range(4)]
    assert sum(singles).item() == pytest.approx(whole)
    # What the shared normalizer prevents: each pass divided by its own count gives another number.
    own = [aggregation(VALUES[rows], MASK[rows]) for rows in (slice(0, 2), slice(2, 4))]
    assert sum(own).item() == pytest.approx(own_normalizers) and own_normalizers != pytest.approx(whole)


def test_the_two_aggregations_weigh_tokens_differently():
    # One long sequence with loss 1 per token, one short with loss 0: the token mean follows the long one.
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert TokenMean()(values, mask).item() == pytest.approx(4 / 5)
    assert SeqMeanTokenMean()(values, mask).item() == pytest.approx((1 + 0) / 2)


def test_the_defaults_and_the_saved_settings():
    loss = GRPOLoss()
    assert loss.aggregation == TokenMean() and loss.mismatch_correction is None
    plain = GRPOLoss(aggregation=SeqMeanTokenMean(), mismatch_correction=SequenceMask(high=2.5)).as_dict()
    assert plain["policy_loss"] == {"class_path": "evolrl.algorithms.policy_loss.ClippedSurrogate",
                                    "init_args": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}}
    assert plain["aggregation"] == {"class_path": "evolrl.algorithms.aggregation.SeqMeanTokenMean", "init_args": {}}
    assert plain["mismatch_correction"] == {"class_path": "evolrl.algorithms.corrections.SequenceMask",
                                           "init_args": {"low": 0.0, "high": 2.5}}


@pytest.mark.parametrize(("loss", "args", "aggregation", "correction"), [
    ({}, [], TokenMean(), None),
    ({"aggregation": "evolrl.algorithms.SeqMeanTokenMean",
      "mismatch_correction": "evolrl.algorithms.TokenTruncate"}, [], SeqMeanTokenMean(), TokenTruncate(cap=2.0)),
    ({"mismatch_correction": {"class_path": "evolrl.algorithms.SequenceMask", "init_args": {"high": 2.5}}}, [],
     TokenMean(), SequenceMask(low=0.0, high=2.5)),
    ({"aggregation": {"class_path": "evolrl.algorithms.TokenMean"}},
     ["--model.loss.mismatch_correction", "evolrl.algorithms.TokenTruncate",
      "--model.loss.mismatch_correction.cap", "1.5"], TokenMean(), TokenTruncate(cap=1.5)),
    ({}, ["--model.loss.aggregation", "SeqMeanTokenMean", "--model.loss.mismatch_correction", "SequenceMask",
          "--model.loss.mismatch_correction.low", "0.25"], SeqMeanTokenMean(), SequenceMask(low=0.25, high=3.0)),
], ids=["defaults", "short class paths", "class_path and init_args", "command line", "command line, short names"])
def test_the_cli_selects_each_class(tmp_path, tiny_model, monkeypatch, loss, args, aggregation, correction):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = tiny_config(tmp_path, tiny_model)
    if loss:
        (tmp_path / "loss.yaml").write_text(yaml.safe_dump({"model": {"loss": loss}}))
        args = ["--config", str(tmp_path / "loss.yaml"), *args]
    cli = main(["--config", str(config), *args], run=False)
    chosen = cli.model.update.loss
    assert chosen.aggregation == aggregation and type(chosen.aggregation) is type(aggregation)
    assert chosen.mismatch_correction == correction
    assert cli.model.hparams["loss"] == chosen.as_dict()  # plain values in the checkpoint
