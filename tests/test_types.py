from pathlib import Path

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
    from evolrl.types import Components

    declared = Components({"valid": torch.ones(1, 2, dtype=torch.bool)}, names=("valid", "majority", "novelty"))
    out = RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",), components=declared)
    assert out.components is declared
    assert "valid" in out.components and "novelty" not in out.components  # declared: present or absent
    assert out.components.get("novelty") is None
    with pytest.raises(KeyError, match="'majorty' is not a component its reward declares .*: valid, majority, novelty"):
        "majorty" in out.components  # noqa: B015 (the test is that asking raises)
    with pytest.raises(KeyError, match="'majorty' is not a component"):
        out.components.get("majorty")
    with pytest.raises(KeyError, match="this reward output has no component 'novelty'; it has valid"):
        out.components["novelty"]
    with pytest.raises(KeyError, match="'my_bonus' is not a component its reward declares"):
        Components({"my_bonus": torch.zeros(1, 2)}, names=("valid",))
    plain = RewardOutput(torch.zeros(1, 2), (("1", None),), labels=("1",), components={"my_bonus": torch.zeros(1, 2)})
    assert plain.components.names == ("my_bonus",)  # a plain mapping declares its own names
    with pytest.raises(KeyError, match="'valid' is not a component"):
        "valid" in plain.components  # noqa: B015


def test_a_reader_of_any_reward_sees_the_names_it_reads():
    from evolrl.types import Components

    parts = Components({"valid": torch.ones(1, 2), "cluster_share": torch.ones(1, 2)}, names=("valid", "cluster_share"))
    view = parts.view(("valid", "novelty"))
    assert "valid" in view and "novelty" not in view and list(view) == ["valid"]
    with pytest.raises(KeyError, match="'cluster_share' is not a component"):
        view["cluster_share"]


def test_types_names_no_reward_component():
    """Each reward declares its own components; the records know none of them and keep no registry."""
    from evolrl import rewards, types

    source = Path(types.__file__).read_text(encoding="utf-8")
    declared = {name for cls in vars(rewards).values() if isinstance(cls, type) and issubclass(cls, rewards.Reward)
                for name in cls.components}
    assert {"valid", "novelty", "cluster_share", "neg_entropy"} <= declared
    assert [name for name in declared if any(q + name + q in source for q in ('"', "'", "``"))] == []
    assert not hasattr(types, "COMPONENTS") and not hasattr(types, "register_component")


def test_a_step_output_is_typed_and_refuses_unknown_keys():
    from evolrl.types import StepOutput

    batch = RolloutBatch((ResponseGroup(Prompt("a", "q"), ("x", "y")),), temperature=0.7)
    rewards = RewardOutput(torch.zeros(1, 2), ((None, None),), (None,))
    out = StepOutput(rollouts=batch, rewards=rewards, stats={"loss": 0.5}, timing={"step": 1.0})
    assert out["stats"] is out.stats and out.copy() is out and list(out) == ["rollouts", "rewards", "stats", "timing"]
    assert "loss" not in out  # what Lightning asks of a manual step's output
    with pytest.raises(KeyError, match="'stat' is not part of a step output: rollouts, rewards, stats, timing"):
        out["stat"]
