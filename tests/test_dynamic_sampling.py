"""Dynamic sampling (``data.dynamic_sampling``): agreeing groups dropped, further prompts sampled in their place, the
rounds and counts logged, and an exact resume after steps with extra rounds.

The prompts come unshuffled, so which prompts each round draws is known in advance, and a reward (:class:`Marked`)
gives distinct rewards to the marked prompts' responses and equal ones to the others': every expected count below
follows from those two facts, not from a recording.
"""

from __future__ import annotations

import pytest
import torch
import yaml
from helpers import Recorder, fit_checkpointed, scalars, tiny_config

from evolrl.cli import main
from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.rewards import Reward
from evolrl.rollout import DynamicSampling, HFEngine, Sampling
from evolrl.settings import SettingError
from evolrl.training import Batching, EvolRLModule
from evolrl.training.optim import Optimization
from evolrl.types import RewardOutput, RolloutBatch

MARKED = {"add-2", "add-5", "add-6", "add-7"}


class Marked(Reward):
    """Rewards 0, 1, ..., V-1 for a marked prompt's responses (any two trained ones disagree), all 0 otherwise."""

    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        varied = torch.arange(batch.group_size, dtype=torch.float32)
        rewards = torch.stack([varied if p.id in MARKED else torch.zeros(batch.group_size) for p in batch.prompts])
        return RewardOutput(rewards, answers=tuple((None,) * batch.group_size for _ in batch.groups),
                            labels=(None,) * batch.num_prompts)


class Kept(Recorder):
    """The prompts each step trained on and its dynamic-sampling numbers, besides the versions and losses."""

    def __init__(self):
        super().__init__()
        self.prompts, self.stats = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        self.prompts.append([p.id for p in outputs["rollouts"].prompts])
        self.stats.append({k.split("/")[1]: v for k, v in outputs["stats"].items() if k.startswith("dynamic")})


def run(model_dir, directory, steps=4, ckpt_path=None, max_rounds=3):
    module = EvolRLModule(model_dir, reward=Marked(), batching=Batching(6, 2), optim=Optimization(lr=1e-2))
    data = RolloutDataModule(AdditionPrompts(count=16), model=model_dir, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=4, trained_samples=3, sampling=Sampling(max_new_tokens=6), shuffle=False,
                             dynamic_sampling=DynamicSampling(max_rounds=max_rounds))
    return fit_checkpointed(module, data, directory, Kept(), ckpt_path, max_steps=steps), module


def test_agreeing_groups_are_dropped_and_further_prompts_fill_the_step(tmp_path, tiny_model):
    kept, _ = run(tiny_model, tmp_path / "run", steps=5)
    # 8 batches an epoch, in order: [0, 1], [2, 3], ... (ids add-0 ... add-15); marked: 2, 5, 6, 7.
    assert kept.prompts == [
        ["add-2", "add-5"],  # rounds [0, 1], [2, 3], [4, 5]: 2 kept of 6 groups
        ["add-6", "add-7"],  # [6, 7]: both kept in the first round
        ["add-8", "add-9"],  # [8, 9], [10, 11], [12, 13]: none kept, so the first round's groups train
        ["add-2"],  # [14, 15], then the next epoch's [0, 1] and [2, 3]: one kept in three rounds
        ["add-5", "add-6"],  # the next epoch goes on where those rounds left it: [4, 5], [6, 7]
    ]
    assert kept.stats == [
        {"rounds": 3.0, "kept_groups": 2.0, "dropped_groups": 4.0},
        {"rounds": 1.0, "kept_groups": 2.0, "dropped_groups": 0.0},
        {"rounds": 3.0, "kept_groups": 0.0, "dropped_groups": 6.0},
        {"rounds": 3.0, "kept_groups": 1.0, "dropped_groups": 5.0},
        {"rounds": 2.0, "kept_groups": 2.0, "dropped_groups": 1.0},  # add-7 kept too, beyond the step's two
    ]
    assert kept.versions == [0, 1, 2, 3, 4]  # one weights version per step, whatever its rounds


@pytest.mark.parametrize("step", [1, 3, 4])
def test_resume_after_steps_with_extra_rounds_is_exact(tmp_path, tiny_model, step):
    """Resumed after the first step (three rounds), after the step that began the next epoch, and after the step
    that continued it: the next steps train on the same prompts, with the same losses and weights."""
    full, full_module = run(tiny_model, tmp_path / "full", steps=5)
    resumed, module = run(tiny_model, tmp_path / "resumed", steps=5, ckpt_path=tmp_path / "full" / f"step={step}.ckpt")
    assert resumed.prompts == full.prompts[step:]
    assert resumed.stats == full.stats[step:]
    assert resumed.losses == full.losses[step:]
    final, expected = module.policy.state_dict(), full_module.policy.state_dict()
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_the_cli_logs_the_rounds(tmp_path, tiny_model):
    config = tiny_config(tmp_path, tiny_model, steps=2, reward="MajorityVoteReward")
    main(["fit", "--config", str(config), "--data.dynamic_sampling.max_rounds=3"])
    curves = scalars(tmp_path / "tiny")
    for name in ("rounds", "kept_groups", "dropped_groups"):
        values = curves[f"train/dynamic_sampling/{name}"]
        assert len(values) == 2 and all(v >= 0 for v in values)
    assert all(1 <= r <= 3 for r in curves["train/dynamic_sampling/rounds"])


def test_max_rounds_below_one_stops_fit_at_start(tmp_path, tiny_model, capsys):
    config = tiny_config(tmp_path, tiny_model)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--data.dynamic_sampling.max_rounds=0"])
    assert "DynamicSampling.max_rounds" in capsys.readouterr().err
    with pytest.raises(SettingError, match="max_rounds"):
        DynamicSampling(max_rounds=0)
    assert yaml.safe_load(config.read_text())["data"].get("dynamic_sampling") is None  # off unless set
