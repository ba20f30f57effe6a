"""The learning-rate schedule and the run's optimizer-step count, against values worked out by hand.

The schedule (``evolrl/training/optim.py``): over ``total`` optimizer steps, ``warmup = ceil(warmup_ratio * total)``
steps rising linearly from ``1 / warmup`` to 1, then a cosine from 1 down to ``min_lr_ratio``; ``total`` is learnt at
the first training step as training steps x mini-batches per step. The expected multipliers below are the formula
evaluated by hand for each case, written as arithmetic so that a reader can check them; they go through Python
floats only, hence ``pytest.approx``'s default relative tolerance (1e-6).
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from helpers import StreamingDataModule, fit

from evolrl.settings import SettingError
from evolrl.training import Optimization
from evolrl.training.optim import WarmupCosine, build_optimizer, start_schedule, warmup_cosine

# 10 optimizer steps, warm-up ratio 0.2 -> ceil(2.0) = 2 warm-up steps, cosine over the other 8 down to 0.1.
TEN_STEPS = [
    1 / 2,  # step 0: the first warm-up step already learns, at 1/warmup
    2 / 2,  # step 1: the end of warm-up, the peak
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0 / 8)),  # step 2: the cosine's start, 1.0
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 1 / 8)),
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 8)),
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 8)),
    0.1 + 0.9 * 0.5 * (1 + 0.0),  # step 6: mid-cosine, cos(pi / 2) = 0: halfway between 1 and 0.1, 0.55
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 8)),
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 6 / 8)),
    0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)),  # step 9: the last optimizer step, 0.1343
]


def test_the_multiplier_at_each_step_of_a_small_case():
    assert ([warmup_cosine(step, 10, warmup_ratio=0.2, min_lr_ratio=0.1) for step in range(10)]
            == pytest.approx(TEN_STEPS))
    assert TEN_STEPS[6] == pytest.approx(0.55) and TEN_STEPS[9] == pytest.approx(0.134254, rel=1e-5)
    # after the last step: the floor
    assert warmup_cosine(10, 10, warmup_ratio=0.2, min_lr_ratio=0.1) == pytest.approx(0.1)
    # A warm-up ratio that is not a whole number of steps rounds up: 0.03 x 10 -> 1 step, at the peak at once.
    assert warmup_cosine(0, 10, 0.03) == 1.0
    assert warmup_cosine(1, 10, 0.03) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0 / 9)))
    assert warmup_cosine(5, 10, 0.03) == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 9)))
    # No warm-up: the cosine from step 0, to min_lr_ratio 0 by default.
    assert warmup_cosine(0, 4, 0.0) == 1.0 and warmup_cosine(2, 4, 0.0) == pytest.approx(0.5)


def test_adamw_gets_the_schedule_once_its_length_is_known():
    """Through the real ``LambdaLR``: the learning rate of each optimizer step, including step 0, set by
    ``start_schedule`` (at construction the length is unknown and the schedule's multiplier is 1)."""
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = build_optimizer([weight], Optimization(lr=0.01, warmup_ratio=0.2, min_lr_ratio=0.1))
    assert isinstance(scheduler.lr_lambdas[0], WarmupCosine) and optimizer.param_groups[0]["lr"] == 0.01
    start_schedule(scheduler, 10)
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.01 * m for m in TEN_STEPS])


def test_a_restored_schedule_continues_at_its_step():
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = build_optimizer([weight], Optimization(lr=0.01, warmup_ratio=0.2, min_lr_ratio=0.1))
    scheduler.last_epoch = 6  # as a checkpoint taken after 6 optimizer steps leaves it
    start_schedule(scheduler, 10)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.55)


class LearningRates(L.Callback):
    """The learning rate and the optimizer steps taken after each training step."""

    def __init__(self) -> None:
        self.after: list[tuple[float, int]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after.append((module.optimizers().param_groups[0]["lr"], module.lr_schedulers().last_epoch))


def test_a_tiny_fit_takes_max_steps_times_the_mini_batches_and_ends_the_schedule_there(tiny_model):
    """2 prompts x 3 trained responses = 6 sequences per training step, mini-batches of 3: 2 optimizer steps per
    training step; max_steps 3 (of the 4 batches an epoch has): 6 optimizer steps in all. Warm-up ceil(0.3 x 6) = 2
    steps, then a cosine over 4, so after training step t (2t optimizer steps): t = 1: progress 0/4, multiplier 1;
    t = 2: 2/4, 0.1 + 0.9 x 0.5; t = 3: 4/4, the floor 0.1, reached exactly when the run ends."""
    lrs = LearningRates()
    module, _, _ = fit(tiny_model, steps=4, module_kwargs={
        "mini_batch_size": 3, "micro_batch_size": 3,
        "optim": Optimization(lr=1e-3, warmup_ratio=0.3, min_lr_ratio=0.1)}, callbacks=[lrs],
        trainer_kwargs={"max_steps": 3})
    assert module.trainer.global_step == 3
    assert module.lr_schedulers().lr_lambdas[0].total == 3 * 2
    assert module.optimizers().optimizer.state[next(module.policy.parameters())]["step"].item() == 6
    assert [steps for _, steps in lrs.after] == [2, 4, 6]
    assert [lr for lr, _ in lrs.after] == pytest.approx([1e-3 * 1.0, 1e-3 * (0.1 + 0.9 * 0.5), 1e-3 * 0.1])


def test_training_data_without_a_length_takes_its_length_from_max_steps(tiny_model):
    """An unsized loader: 2 training steps of max_steps, one mini-batch each (the default mini-batch of 6)."""
    module, _, _ = fit(tiny_model, steps=1.0, datamodule_cls=StreamingDataModule, trainer_kwargs={"max_steps": 2})
    assert module.lr_schedulers().lr_lambdas[0].total == 2 * 1


def test_training_data_without_a_length_and_no_max_steps_is_refused(tiny_model):
    with pytest.raises(SettingError, match="trainer.max_steps=-1 is not allowed: a positive number of training steps"):
        fit(tiny_model, steps=1.0, datamodule_cls=StreamingDataModule)
