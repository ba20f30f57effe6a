"""evolrl's callbacks inside a foreign Lightning module written here, checked against hand-computed values."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from helpers import ForeignRL, eval_view, train_view
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from evolrl.callbacks import LabelFreeDiagnostics, PassAtK, PolicyStats, SampleLogger, TrainView


def test_callbacks_in_a_foreign_module(tmp_path):
    logged: list[dict] = []

    class Capture(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            logged.append({k: v.item() for k, v in trainer.callback_metrics.items()})

    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=TensorBoardLogger(tmp_path, name="foreign"), num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=[LabelFreeDiagnostics(extract=train_view), PolicyStats(extract=train_view),
                   PassAtK(pass_ks=(1, 2), maj_ks=(3,), extract=eval_view, output_dir=str(tmp_path / "eval")),
                   SampleLogger(rows=2, extract=train_view), Capture()],
    )
    trainer.fit(ForeignRL())
    first = logged[0]
    # rewards [1,0,1,1,.5,.5,.5,.5]: mean 5/8, population std
    assert first["train/reward_mean"] == pytest.approx(0.625)
    assert first["train/reward_std"] == pytest.approx(torch.tensor([1, 0, 1, 1, .5, .5, .5, .5]).float().std(
        unbiased=False).item())
    assert first["train/zero_variance_groups"] == 0.5
    assert first["train/majority_ratio"] == 7 / 8
    assert first["train/distinct_answers"] == 1.5
    assert first["train/valid_rate"] == 1.0
    assert first["train/label_accuracy"] == 0.5  # prompt 0 voted 4 (truth 4), prompt 1 voted 2 (truth 3)
    # reward accuracy: prompt 0 majority [1,0,1,1] vs correct [1,0,1,1]; prompt 1 [1,1,1,1] vs [0,0,0,0]
    assert first["train/reward_accuracy"] == 0.5
    assert first["train/entropy"] == 0.25
    assert first["train/response_length"] == 25.0
    assert first["train/response_length_max"] == 40.0
    assert first["train/truncated_frac"] == 0.25
    assert logged[1]["train/entropy"] == 0.5
    final = {k: v.item() for k, v in trainer.callback_metrics.items()}
    assert final["train_epoch/entropy"] == pytest.approx(0.375)  # mean of 0.25 and 0.5
    assert final["train_epoch/response_length"] == pytest.approx(37.5)
    # pass@1 = mean accuracy per problem: (0.5 + 0.5) / 2 ; pass@2 = 1 - C(2,2)/C(4,2) = 5/6 for both
    assert final["val/toy/pass@1"] == pytest.approx(0.5)
    assert final["val/toy/pass@2"] == pytest.approx(5 / 6)
    # maj@3, problem 1: draws of 3 from {1,1,2,3}: {1,1,x} twice -> right; {1,2,3} twice -> 1/3 each -> (2 + 2/3) / 4
    # problem 2: {8,8,x} twice -> right; {7,8,9} twice -> 1/3 -> same
    assert final["val/toy/maj@3"] == pytest.approx((2 + 2 / 3) / 4)
    table = json.loads((tmp_path / "eval" / "val_metrics.json").read_text())
    assert table["toy"]["pass@1"] == pytest.approx(0.5) and table["toy"]["problems"] == 2
    assert (tmp_path / "eval" / "val_metrics.csv").read_text().startswith("dataset,")


def test_sample_logger_writes_tensorboard_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_val_batches=0, logger=TensorBoardLogger(tmp_path),
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        callbacks=[SampleLogger(rows=2, extract=train_view)])
    trainer.fit(ForeignRL())
    events = EventAccumulator(trainer.logger.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    texts = events.Tensors("train/samples/text_summary")
    assert [t.step for t in texts] == [0, 1]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "| question 0 | a \\| b | 4 | 1.000 |" in table
    assert "question 1" in table


def text_steps(log_dir) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(log_dir, size_guidance={"tensors": 0})
    events.Reload()
    return [t.step for t in events.Tensors("train/samples/text_summary")]


def test_sample_logger_counts_training_steps_across_epochs(tmp_path):
    def run(extract, name):
        trainer = L.Trainer(accelerator="cpu", max_epochs=3, limit_val_batches=0, enable_progress_bar=False,
                            logger=TensorBoardLogger(tmp_path, name=name), enable_model_summary=False,
                            enable_checkpointing=False, callbacks=[SampleLogger(every_n_steps=2, extract=extract)])
        trainer.fit(ForeignRL())
        return text_steps(trainer.logger.log_dir)

    # 3 epochs of 2 steps: steps 0..5, every second one, not batch 0 of each epoch again
    assert run(train_view, "with_step") == [0, 2, 4]

    def without_step(outputs, batch):  # falls back to trainer.global_step, which already counts this step
        return TrainView(rewards=outputs["my_rewards"], rollouts=outputs["groups"])

    assert run(without_step, "without_step") == [2, 4, 6]


class ForeignEval(ForeignRL):
    """Uses evolrl's torchmetrics metrics itself, with self.log."""

    def __init__(self):
        super().__init__()
        from evolrl.metrics import MajAtKMetric, PassAtKMetric

        self.pass_2 = PassAtKMetric(2)
        self.maj_3 = MajAtKMetric(3)

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        if batch == 1:  # two other problems, every sample right
            out["correct"] = [[True] * 4, [True] * 4]
        ids = [f"q{batch}-{i}" for i in range(2)]
        for metric, name in ((self.pass_2, "val/pass@2"), (self.maj_3, "val/maj@3")):
            metric.update(out["answers"], out["correct"], ids)
            self.log(name, metric, on_epoch=True)
        return out

    def val_dataloader(self):
        return DataLoader([0, 0, 1], batch_size=1)  # problem batch 0 twice: counted once


def test_the_metrics_log_with_self_log_in_a_foreign_module():
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    for _ in range(2):  # Lightning resets the metrics after each epoch
        metrics = trainer.validate(ForeignEval(), verbose=False)[0]
        # 4 distinct problems: the two of batch 0 (scored as in test_callbacks_in_a_foreign_module) and two right
        assert metrics["val/pass@2"] == pytest.approx((5 / 6 + 5 / 6 + 1 + 1) / 4)
        assert metrics["val/maj@3"] == pytest.approx(((2 + 2 / 3) / 4 * 2 + 1 + 1) / 4)


def test_pass_at_k_defaults_to_pass_1_pass_n_and_maj_n(tmp_path):
    callback = PassAtK(extract=eval_view, output_dir=str(tmp_path))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback])
    trainer.validate(ForeignRL(), verbose=False)
    metrics = {name: value.item() for name, value in trainer.callback_metrics.items()}
    assert set(metrics) == {"val/toy/pass@1", "val/toy/pass@4", "val/toy/maj@4"}  # 4 samples per problem
    assert metrics["val/toy/pass@4"] == 1.0 and metrics["val/toy/pass@1"] == pytest.approx(0.5)
    # maj@4: problem 1 votes 1 (right), problem 2 votes 8 (right)
    assert metrics["val/toy/maj@4"] == 1.0
    assert callback.table == {"toy": {"problems": 2, "samples": 4, "pass@1": 0.5, "pass@4": 1.0, "maj@4": 1.0}}
    assert json.loads((tmp_path / "val_metrics.json").read_text())["toy"] == callback.table["toy"]


@pytest.mark.parametrize(("ks", "message"), [
    ({"pass_ks": (1, 8)}, ("PassAtK.pass_ks=[1, 8] is not allowed: pass@8 needs at least 8 samples per problem, "
                           "but evaluation set 'toy' has 4; raise data.eval_samples to 8 or more, or drop 8 from "
                           "the callback's pass_ks")),
    ({"pass_ks": (1,), "maj_ks": (5, 16)}, ("PassAtK.maj_ks=[5, 16] is not allowed: maj@5 needs at least 5 samples "
                                            "per problem, but evaluation set 'toy' has 4; raise data.eval_samples "
                                            "to 16 or more, or drop 5, 16 from the callback's maj_ks")),
], ids=["pass", "maj"])
def test_a_k_above_the_samples_per_problem_stops_the_first_evaluation_batch(ks, message):
    from evolrl.settings import SettingError

    batches = []

    class Count(L.Callback):
        def on_validation_batch_start(self, *args):
            batches.append(1)

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[PassAtK(**ks, extract=eval_view), Count()])
    with pytest.raises(SettingError) as err:
        trainer.validate(ForeignRL(), verbose=False)
    assert message in str(err.value)
    assert len(batches) == 1
