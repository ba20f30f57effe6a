"""evolrl's callbacks inside a foreign Lightning module written here, checked against hand-computed values."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from evolrl.callbacks import EvalView, LabelFreeDiagnostics, PassAtK, PolicyStats, SampleLogger, TrainView
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch


class ForeignRL(L.LightningModule):
    """Not evolrl's module: a toy with its own output format."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        loss = (self.w - 1.0).pow(2).sum()
        rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
        return {
            "loss": loss,
            "my_rewards": RewardOutput(
                rewards=rewards,
                answers=(("4", "5", "4", "4"), ("2", "2", "2", "2")),
                labels=("4", "2"),
                components={"majority": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]).bool(),
                            "valid": torch.ones(2, 4, dtype=torch.bool),
                            "answer_class": torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]])},
            ),
            "groups": RolloutBatch(tuple(
                ResponseGroup(Prompt(f"p{i}", f"question {i}", answer=truth), ("a | b", "c", "d", "e"))
                for i, truth in enumerate(["4", "3"])
            )),
            "token_entropy": 0.25 * (batch_idx + 1),
            "lengths": torch.tensor([10.0, 20.0, 30.0, 40.0]) * (batch_idx + 1),
            "hit_limit": torch.tensor([False, False, False, True]),
        }

    def validation_step(self, batch, batch_idx):
        # two problems per batch, 4 samples each
        return {"answers": [["1", "1", "2", "3"], ["7", "8", "8", "9"]],
                "correct": [[True, True, False, False], [False, True, True, False]]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(range(2), batch_size=1)

    def val_dataloader(self):
        return DataLoader(range(1), batch_size=1)


def train_view(outputs, batch):
    return TrainView(rewards=outputs["my_rewards"], rollouts=outputs["groups"], entropy=outputs["token_entropy"],
                     response_lengths=outputs["lengths"], truncated=outputs["hit_limit"])


def eval_view(outputs, batch):
    return EvalView("toy", outputs["answers"], outputs["correct"])


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
    assert len(texts) == 2
    table = texts[0].tensor_proto.string_val[0].decode()
    assert "| question 0 | a \\| b | 4 | 1.000 |" in table
    assert "question 1" in table
