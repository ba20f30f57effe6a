"""What stops a run: settings that cannot run together, checked at start (:func:`check_run`, a usage error), and
what a step's numbers say: rewards without variance (a warning, counted over the run and kept in checkpoints), and
the causes that stop it, as errors that name the step, the cause and what to do (a non-finite reward, too many
skipped optimizer steps in a row). ``python -m evolrl`` prints a :class:`TrainingStopped` as one line and exits 1;
the checkpoints saved so far are left as they were."""

from __future__ import annotations

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from evolrl.rollout.remote import check_placement, trainer_gpus
from evolrl.rollout.sampler import check_engine
from evolrl.types import RewardOutput


def check_run(module, data, trainer) -> None:
    """Every rule between the settings of the module, the data module and the trainer, each written here once: a
    SettingError naming the setting. ``python -m evolrl fit`` calls it before any model loads, the module's ``setup``
    when the classes are used without the CLI. The reward's rules come first: what it cannot run with at all (a
    sampler process, a lag) is the error to read before one about that setting's own values."""
    module.reward_hooks.check(module, data, trainer)
    if hasattr(data, "rollouts"):  # a data module that samples, not recorded rollouts
        check_engine(module.mismatch_correction, data.rollouts.engine, data.max_staleness)
        if data.sampler_process is not None and data.supply.remote is None:  # against the trainer's devices, before
            # the process starts (once started, this process no longer runs on the sampler's cores)
            check_placement(data.sampler_process, trainer.world_size, trainer_gpus(trainer))
        if module.overlong is not None:  # its buffer against the sampling budget
            module.overlong.check(data.rollouts.sampling.max_new_tokens)


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
