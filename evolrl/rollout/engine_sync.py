"""Keeping the rollout engine on the policy's current weights: the one place where weights move to the engine.

:class:`EngineSync` is a Lightning callback that the data module registers on its trainer (first in the list, so that
a checkpoint saved at the end of a training step already holds the version the engine got). The training module knows
nothing of it: it trains on the rollout batches it is given and publishes its ``policy``.

* At the start of training, or of an evaluation that comes before it (sanity validation, ``validate``, ``test``), the
  engine gets the current weights as the current version (0, or a resumed checkpoint's), unless it holds them.
* After every training step it gets the new weights as the next version (``time/sync`` logs how long that took).
  So the next step's rollouts, sampled inside that step, come from the weights this step left.
* At ``fit``'s start it refuses a loss that weighs tokens by the sampler's log-probs (a mismatch correction) with an
  engine that reports none.
"""

from __future__ import annotations

import time

import lightning as L

from evolrl.rollout.engine import RolloutEngine
from evolrl.rollout.rollouts import Rollouts
from evolrl.settings import require


def check_engine(mismatch_correction: object | None, engine: RolloutEngine) -> None:
    """SettingError for a mismatch correction with an engine that does not report the log-probs it sampled with."""
    require(mismatch_correction is None or engine.reports_logprobs, "GRPOLoss.mismatch_correction",
            mismatch_correction,
            allowed=f"null (no correction) with {type(engine).__name__}, which does not report the log-probs of the "
            "tokens it samples (the correction weighs tokens by them); use evolrl.rollout.VLLMEngine")


class EngineSync(L.Callback):
    """Hands the training module's ``policy`` to ``rollouts``' engine when its weights change (module docstring)."""

    def __init__(self, rollouts: Rollouts) -> None:
        self.rollouts = rollouts

    @staticmethod
    def policy(module: L.LightningModule):
        policy = getattr(module, "policy", None)
        if policy is None:
            raise TypeError(f"{type(module).__name__} has no `policy`: the rollout engine samples with the weights of "
                            "the module's `policy` attribute (an nn.Module), e.g. evolrl.training.EvolRLModule's")
        return policy

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            check_engine(getattr(module, "mismatch_correction", None), self.rollouts.engine)

    def load_current(self, module: L.LightningModule) -> None:
        if not self.rollouts.loaded:
            self.rollouts.push(self.policy(module), new_version=False)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        # Not at fit's start: a sharded checkpoint is restored only after on_fit_start.
        self.load_current(module)

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.load_current(module)

    def on_test_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.load_current(module)

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx) -> None:
        start = time.perf_counter()
        self.rollouts.push(self.policy(module))
        module.log("time/sync", time.perf_counter() - start, on_step=True, batch_size=1)
