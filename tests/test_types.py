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
    out = RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",),
                       components={"valid": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(TypeError):
        out.components["x"] = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="component 'valid'"):
        RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",), components={"valid": torch.ones(2)})


def test_a_misspelt_component_name_raises_instead_of_reading_as_absent():
    from evolrl.types import register_component

    out = RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",),
                       components={"valid": torch.ones(1, 2, dtype=torch.bool)})
    assert "valid" in out.components and "novelty" not in out.components  # registered: present or absent
    with pytest.raises(KeyError, match="'majorty' is not a reward component: one of valid, majority"):
        "majorty" in out.components  # noqa: B015 (the test is that asking raises)
    with pytest.raises(KeyError, match="this reward output has no component 'novelty'; it has valid"):
        out.components["novelty"]
    with pytest.raises(KeyError, match="'my_bonus' is not a reward component"):
        RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",), components={"my_bonus": torch.zeros(1, 2)})
    register_component("my_bonus", "float: a test reward's own part")
    assert RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",),
                        components={"my_bonus": torch.zeros(1, 2)}).components


def test_a_step_output_is_typed_and_refuses_unknown_keys():
    from evolrl.types import StepOutput

    batch = RolloutBatch((ResponseGroup(Prompt("a", "q"), ("x", "y")),), temperature=0.7)
    rewards = RewardOutput(torch.zeros(1, 2), ((None, None),), (None,))
    out = StepOutput(rollouts=batch, rewards=rewards, stats={"loss": 0.5}, timing={"step": 1.0})
    assert out["stats"] is out.stats and out.copy() is out and list(out) == ["rollouts", "rewards", "stats", "timing"]
    assert "loss" not in out  # what Lightning asks of a manual step's output
    with pytest.raises(KeyError, match="'stat' is not part of a step output: rollouts, rewards, stats, timing"):
        out["stat"]
