"""CollapseMonitor: a synthetic run built to collapse at a known step is flagged there, a healthy one never; it
plugs into a Lightning module that is not evolrl's, logs the step to TensorBoard and can stop training."""

from __future__ import annotations

import warnings
from dataclasses import replace
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from helpers import scalars, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.callbacks import CollapseMonitor, TrainView
from evolrl.settings import SettingError
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch

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


def test_the_windowed_model_collapse_step_needs_a_window_of_low_accuracy_where_urlvr_s_needs_one_step():
    """docs/method.md 4.4: URLVR's Model Collapse Step is the first step with reward accuracy < 0.01; the windowed
    one the first step at which the mean of the last ``model_collapse_window`` known accuracies is < 0.01."""
    accuracies = [0.9, 0.0, 0.8, None, 0.02, 0.005, 0.0, 0.0]  # step 3's is unknown (no answers): not counted
    # windows of 3 known accuracies end at steps 2, 4, 5, 6: means 0.567, 0.273, 0.275, 0.00833 (< 0.01 at step 6)
    monitor = CollapseMonitor(model_collapse_window=3)
    for step, accuracy in enumerate(accuracies[:5]):
        monitor.watch_model_collapse(step, accuracy)
    resumed = CollapseMonitor(model_collapse_window=3)
    resumed.load_state_dict(monitor.state_dict())  # mid-window: the recent accuracies travel in checkpoints
    for step, accuracy in enumerate(accuracies[5:], start=5):
        resumed.watch_model_collapse(step, accuracy)
    assert (resumed.model_collapse_step, resumed.windowed_collapse_step, resumed.accuracy_steps) == (1, 6, 7)
    assert resumed.summary()[1:] == [
        "Model collapse step (URLVR, the first step with reward accuracy < 0.01): 1",
        "Model collapse step (windowed, the first step whose mean reward accuracy over the last 3 steps is < 0.01): 6"]
    assert CollapseMonitor().summary()[2].endswith("not measured (the training prompts carry no answers)")
    with pytest.raises(SettingError, match="CollapseMonitor.model_collapse_window=0 is not allowed"):
        CollapseMonitor(model_collapse_window=0)


def test_both_model_collapse_steps_reach_the_loggers_once():
    """The synthetic run with answers: from COLLAPSE_FROM every group agrees on a wrong 7 (reward accuracy 0, before
    it 1), so URLVR's step is COLLAPSE_FROM and the windowed one, over 5 steps, COLLAPSE_FROM + 4."""
    logged = []
    trainer = SimpleNamespace(loggers=[SimpleNamespace(log_metrics=lambda m, step: logged.append((step, m)))],
                              global_step=0, should_stop=False)
    module = SimpleNamespace(log=lambda *args, **kwargs: None)
    monitor = CollapseMonitor()
    for t in range(COLLAPSE_FROM + 8):
        v = view(t, t >= COLLAPSE_FROM)
        prompts = tuple(ResponseGroup(Prompt(f"p{i}", "q", "1"), ("x",) * 8) for i in range(4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the label-free collapse's own warning
            monitor.on_view(trainer, module, replace(v, rollouts=RolloutBatch(prompts)))
    steps = {name: step for step, metrics in logged for name in metrics}
    assert steps == {"collapse/model_collapse_step": COLLAPSE_FROM,
                     "collapse/model_collapse_window_step": COLLAPSE_FROM + 4, "collapse/step": COLLAPSE_FROM + 4}
    assert len(logged) == 3
