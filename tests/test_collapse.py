"""CollapseMonitor: a synthetic run built to collapse at a known step is flagged there, a healthy one never; it
plugs into a Lightning module that is not evolrl's, logs the step to TensorBoard and can stop training."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers import scalars, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.callbacks import CollapseMonitor, TrainView
from evolrl.settings import SettingError
from evolrl.types import RewardOutput

COLLAPSE_FROM = 12
"""From this step on the synthetic run's groups agree on one answer and its entropy is 0.1 (1.0 before)."""


def view(step: int, collapsed: bool, prompts: int = 4, samples: int = 8) -> TrainView:
    """One step: before the collapse each group answers 1, 2 or 3 (majority ratio 3/8), after it all 7."""
    answers = [["7"] * samples if collapsed else [str(1 + v % 3) for v in range(samples)] for _ in range(prompts)]
    classes = torch.tensor([[0 if collapsed else v % 3 for v in range(samples)]] * prompts)
    majority = classes == 0
    rewards = RewardOutput(majority.float(), tuple(map(tuple, answers)), labels=("7" if collapsed else "1",) * prompts,
                           components={"valid": torch.ones_like(majority), "majority": majority,
                                       "answer_class": classes})
    return TrainView(rewards=rewards, entropy=0.1 if collapsed else 1.0,
                     response_lengths=torch.full((prompts, samples), 20.0 if collapsed else 40.0), step=step)


def first_flag(monitor: CollapseMonitor, views: list[TrainView]) -> int | None:
    for v in views:
        if monitor.observe(monitor.measures(v)):
            return v.step
    return None


def test_a_run_built_to_collapse_is_flagged_at_the_step_its_window_fills_and_a_healthy_one_never():
    run = [view(t, t >= COLLAPSE_FROM) for t in range(30)]
    # Window 5: the mean over steps t-4..t reaches the thresholds once at least 4 of the 5 are collapsed
    # (majority ratio (1 * 4 + 3/8) / 5 = 0.875 >= 0.85; entropy (0.4 + 1) / 5 = 0.28 <= 0.3 of 1.0).
    assert first_flag(CollapseMonitor(majority_ratio=0.85, entropy_fraction=0.3), run) == COLLAPSE_FROM + 3
    # The defaults (0.95, 0.25) need the whole window collapsed.
    assert first_flag(CollapseMonitor(), run) == COLLAPSE_FROM + 4
    # Other measures of the same collapse: one answer per group, half the length.
    assert first_flag(CollapseMonitor(majority_ratio=None, entropy_fraction=None, distinct_answers=1.0,
                                      length_fraction=0.5), run) == COLLAPSE_FROM + 4
    healthy = [view(t, False) for t in range(30)]
    assert first_flag(CollapseMonitor(), healthy) is None
    # Agreement alone is not collapse: a run whose answers agree but whose entropy holds is not flagged.
    agreeing = [TrainView(rewards=view(t, True).rewards, entropy=1.0, step=t) for t in range(30)]
    assert first_flag(CollapseMonitor(), agreeing) is None


def test_a_criterion_whose_measure_the_view_lacks_is_an_error_and_settings_are_checked():
    with pytest.raises(ValueError, match=r"CollapseMonitor.entropy_fraction needs the step's entropy"):
        CollapseMonitor().measures(TrainView(rewards=view(0, False).rewards))
    with pytest.raises(SettingError, match="CollapseMonitor.window"):
        CollapseMonitor(window=0)
    with pytest.raises(SettingError, match="at least one criterion"):
        CollapseMonitor(majority_ratio=None, entropy_fraction=None)
    with pytest.raises(SettingError, match="CollapseMonitor.majority_ratio"):
        CollapseMonitor(majority_ratio=-0.5)


class ForeignModule(L.LightningModule):
    """Someone else's RL module: its own step output, read by its own extractor."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        loss = (self.weight - 1.0).pow(2).sum()
        return {"loss": loss, "my_view": view(batch_idx, batch_idx >= COLLAPSE_FROM)}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(range(40), batch_size=1)


@pytest.mark.parametrize("stop", [False, True])
def test_in_a_foreign_module_the_step_reaches_tensorboard_and_training_can_stop_there(tmp_path, stop):
    monitor = CollapseMonitor(stop=stop, extract=lambda outputs, batch: outputs["my_view"])
    logger = L.pytorch.loggers.TensorBoardLogger(tmp_path, name="foreign")
    trainer = L.Trainer(accelerator="cpu", max_steps=40, callbacks=[monitor], logger=logger, log_every_n_steps=1,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
    with pytest.warns(UserWarning, match=f"collapse at training step {COLLAPSE_FROM + 4}"):
        trainer.fit(ForeignModule())
    assert monitor.collapse_step == COLLAPSE_FROM + 4
    assert trainer.global_step == (COLLAPSE_FROM + 5 if stop else 40)
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*"))))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("collapse/step")] == [(COLLAPSE_FROM + 4, COLLAPSE_FROM + 4)]
    assert monitor.state_dict()["collapse_step"] == COLLAPSE_FROM + 4  # kept in checkpoints


def test_through_the_cli_on_evolrls_own_view(tmp_path, tiny_model, monkeypatch):
    """evolrl's step output gives every measure; criteria that always hold flag step 1 (the relative one compares
    with the first window, so it needs two), once.

    Portable: every criterion holds whatever the tiny model samples (shares >= 0, at most 100 distinct answers,
    lengths of at most 6 tokens against 100x the first step's, which is at least 1), so the machine's kernels and
    random streams cannot move the step; and the reward is the majority vote, which needs no embedder package
    (the MiniLM one was missing on the first GPU machine the suite ran on)."""

    import yaml

    from evolrl.cli import main

    path = tiny_config(tmp_path, tiny_model, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["trainer"]["callbacks"].append({"class_path": "evolrl.callbacks.CollapseMonitor", "init_args": {
        "window": 1, "majority_ratio": 0.0, "entropy_fraction": None, "zero_variance_groups": 0.0,
        "distinct_answers": 100.0, "length_fraction": 100.0, "reward_accuracy": 1.0}})
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setattr("sys.argv", ["evolrl"])
    with pytest.warns(UserWarning, match="collapse at training step 1"):
        main(["fit", "--config", str(path)])
    assert scalars(tmp_path)["collapse/step"] == [1.0]
