import pytest
import torch

from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch


def test_batch_shape_and_truncation():
    groups = tuple(ResponseGroup(Prompt(str(i), "q"), ("a", "b"), truncated=(False, True)) for i in range(3))
    batch = RolloutBatch(groups)
    assert (batch.num_prompts, batch.group_size) == (3, 2)
    assert batch.truncated().tolist() == [[False, True]] * 3


def test_groups_must_have_equal_size():
    with pytest.raises(ValueError, match=r"same size, got sizes \[1, 2\]"):
        RolloutBatch((ResponseGroup(Prompt("a", "q"), ("x",)), ResponseGroup(Prompt("b", "q"), ("x", "y"))))


def test_truncation_flags_must_match():
    with pytest.raises(ValueError, match="prompt 'a': 1 truncated for 2 responses"):
        ResponseGroup(Prompt("a", "q"), ("x", "y"), truncated=(True,))


def test_reward_output_checks_shapes_and_freezes_components():
    out = RewardOutput(torch.zeros(1, 2), (("1", None),), ("1",), {"valid": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(TypeError):
        out.components["x"] = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="component 'valid'"):
        RewardOutput(torch.zeros(1, 2), (("1", None),), ("1",), {"valid": torch.ones(2)})
