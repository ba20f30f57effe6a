"""Overlong shaping (``model.overlong``): the soft penalty on truncated, in-buffer and short responses, the mask that
leaves truncated responses out of the loss, and the settings checked at start.

Expected values are worked out from the lengths in each test (exact in float32: small integers and halves).
"""

from __future__ import annotations

import pytest
import torch
from helpers import scalars, tiny_config

from evolrl.algorithms import GroupAdvantages, OverlongMask, OverlongPenalty, TokenMean
from evolrl.cli import main
from evolrl.rewards import Reward
from evolrl.settings import SettingError
from evolrl.training.scoring import Scoring
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch

BUDGET = 10


def test_the_penalty_on_truncated_in_buffer_and_short_responses():
    # buffer 4 of 10: 0 up to 6 tokens, then -1/4 per token, and -1 (x factor) at the limit or truncated
    lengths = torch.tensor([[3, 6, 7, 8, 10, 10]])
    truncated = torch.tensor([[False, False, False, False, False, True]])
    penalty = OverlongPenalty(buffer=4, factor=2.0).penalty(lengths, truncated, BUDGET)
    assert penalty.tolist() == [[0.0, 0.0, -0.5, -1.0, -2.0, -2.0]]
    # a truncated response gets the whole penalty even where its counted length is short (an empty response)
    assert OverlongPenalty(buffer=4).penalty(torch.tensor([[0]]), torch.tensor([[True]]), BUDGET).tolist() == [[-1.0]]
    # the default buffer: a fifth of the budget, 2 of 10
    assert OverlongPenalty().penalty(torch.tensor([[8, 9]]), torch.tensor([[False, False]]), BUDGET).tolist() == [
        [0.0, -0.5]]


class Constant(Reward):
    """The same reward for every response: only the shaping makes the group's advantages differ."""

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        return RewardOutput(torch.ones(batch.num_prompts, batch.group_size),
                            answers=tuple((None,) * batch.group_size for _ in batch.groups),
                            labels=(None,) * batch.num_prompts)


def batch() -> RolloutBatch:
    """One prompt of 3 tokens, four responses: 2 tokens (short), 8 (in the buffer), 10 truncated, 10 truncated."""
    lengths, truncated = (2, 8, 10, 10), (False, False, True, True)
    group = ResponseGroup(Prompt("p", "q"), texts=("a",) * 4, truncated=truncated, prompt_ids=(1, 2, 3),
                          response_ids=tuple(tuple(range(5, 5 + n)) for n in lengths))
    return RolloutBatch((group,), weights_version=0, trained=torch.tensor([[0, 1, 2, 3]]), temperature=1.0,
                        max_new_tokens=BUDGET)


def scoring(overlong) -> Scoring:
    return Scoring(Constant(), GroupAdvantages(), overlong, torch.device("cpu"), policy_pass=None, vocabulary=300)


def test_the_penalty_shapes_the_rewards_and_so_the_advantages():
    scored = scoring(OverlongPenalty(buffer=4))(batch())
    assert scored.rewards.rewards.tolist() == [[1.0, 0.5, 0.0, 0.0]]  # 1, 1 - 2/4, 1 - 1, 1 - 1
    assert scored.advantages[0, 0] > scored.advantages[0, 1] > scored.advantages[0, 2] == scored.advantages[0, 3]
    assert scored.stats == {"overlong/penalized": 0.75}
    assert scored.seqs.response_mask.sum(-1).tolist() == [2, 8, 10, 10]  # nothing masked


def test_the_mask_leaves_truncated_responses_out_of_the_loss():
    scored = scoring(OverlongMask())(batch())
    assert scored.rewards.rewards.tolist() == [[1.0] * 4]  # rewards untouched
    assert scored.seqs.response_mask.sum(-1).tolist() == [2, 8, 0, 0]
    assert scored.stats == {"overlong/masked": 0.5}
    # the token mean's normalizer counts the kept responses' tokens only
    assert TokenMean().normalizer(scored.seqs.response_mask).item() == 10
    assert scored.response_length() == 7.5  # the bar's length still counts every trained response


def test_no_shaping_by_default():
    scored = scoring(None)(batch())
    assert scored.stats == {} and scored.seqs.response_mask.sum(-1).tolist() == [2, 8, 10, 10]


@pytest.mark.parametrize("overlong", [
    {"class_path": "evolrl.algorithms.OverlongPenalty", "init_args": {"buffer": 4}},
    {"class_path": "evolrl.algorithms.OverlongMask"},
])
def test_a_cli_step_with_each_mode(tmp_path, tiny_model, overlong):
    main(["fit", "--config", str(tiny_config(tmp_path, tiny_model, steps=1, overlong=overlong))])
    name = "penalized" if "Penalty" in overlong["class_path"] else "masked"
    values = scalars(tmp_path / "tiny")[f"train/overlong/{name}"]
    assert len(values) == 1 and 0.0 <= values[0] <= 1.0


def test_a_buffer_as_long_as_the_budget_stops_fit_at_start(tmp_path, tiny_model, capsys):
    config = tiny_config(tmp_path, tiny_model, overlong={  # the tiny config samples 6 new tokens
        "class_path": "evolrl.algorithms.OverlongPenalty", "init_args": {"buffer": 6}})
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config)])
    err = capsys.readouterr().err
    assert "model.overlong.init_args.buffer" in err and "max_new_tokens=6" in err
    with pytest.raises(SettingError, match="OverlongPenalty.buffer"):
        OverlongPenalty(buffer=0)
    with pytest.raises(SettingError, match="OverlongPenalty.factor"):
        OverlongPenalty(factor=0.0)
