"""What a step's numbers say about the run: rewards without variance (a warning, counted over the run and kept in
checkpoints), and the causes that stop it, as errors that name the step, the cause and what to do (a non-finite
reward, too many skipped optimizer steps in a row). ``python -m evolrl`` prints a :class:`TrainingStopped` as one line
and exits 1; the checkpoints saved so far are left as they were. Settings that cannot run together: ``run_check.py``."""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from evolrl.types import RewardOutput


class FlatRewardCheck:
    """Warns when no group of a step has reward variance: every advantage is 0 (not NaN), only KL/entropy act.

    The warning comes at the 1st, 2nd, 4th, 8th, ... such step, with the rate so far: a run where most steps are flat
    says so without a warning every step (``train/zero_variance_groups`` has the curve)."""

    def __init__(self) -> None:
        self.steps_seen = 0
        self.steps_without_variance = 0

    def __call__(self, advantages: Tensor) -> None:
        """Count the step whose ``[P, G]`` advantages these are; warn, with the rate so far, when all are 0."""
        self.steps_seen += 1
        if bool((advantages == 0).all()):
            self.steps_without_variance += 1
            if self.steps_without_variance & (self.steps_without_variance - 1):  # not a power of two
                return
            rank_zero_warn(
                f"training step {self.steps_seen - 1}: all {advantages.shape[0]} groups have equal rewards "
                f"(e.g. every response invalid or identical), so every advantage is 0; "
                f"{self.steps_without_variance} of {self.steps_seen} steps so far had no reward variance"
            )

    def state_dict(self) -> dict[str, int]:
        return {"steps_seen": self.steps_seen, "steps_without_variance": self.steps_without_variance}

    def load_state_dict(self, state: dict) -> None:
        self.steps_seen = state["steps_seen"]
        self.steps_without_variance = state["steps_without_variance"]


class TrainingStopped(RuntimeError):
    """The run cannot go on: the message names the step, the cause and what to do."""


AFTER = "the checkpoints saved so far are kept; fix the cause, then resume with --ckpt_path last"


def check_rewards(reward: object, output: RewardOutput, trained: torch.Tensor, step: int) -> None:
    """:class:`TrainingStopped` where a trained response's reward is NaN or infinite: its advantage, the loss and
    every gradient of the step would be too, and each later step would be skipped, silently."""
    rewards = output.rewards.gather(1, trained.to(output.rewards.device))  # [P, G]
    bad = ~torch.isfinite(rewards)
    if bad.any():
        raise TrainingStopped(
            f"{type(reward).__name__} gave {int(bad.sum())} of the {bad.numel()} trained responses a non-finite reward "
            f"(NaN or inf) at step {step} (groups {sorted(set(bad.nonzero()[:, 0].tolist()))}); {AFTER}")


def too_many_skips(in_a_row: int, tolerated: int) -> TrainingStopped:
    return TrainingStopped(
        f"{in_a_row} optimizer steps in a row had a non-finite gradient norm and were skipped (tolerated: "
        f"Optimization.max_consecutive_skips={tolerated}); the weights have not moved since. Lower the learning rate "
        f"or check the inputs; {AFTER}")
