"""The training step's calls to the rollout side, by name: take the next rollouts, hand over the new weights.

A training step (``EvolRLModule.training_step``) reads top to bottom: ``next_rollouts`` returns the responses to train
on (sampled with the weights of this step, or of up to ``max_staleness`` steps before), and after the update
``hand_weights`` gives the sampler the new weights, as the next version, before the step ends (so a checkpoint saved
at the step's end holds that version). Before training or an evaluation the module hands over the current weights,
unless the engine holds them (a resumed run's restored weights, an evaluation without training).
``evolrl.data.RolloutDataModule`` is the :class:`~evolrl.types.Sampler` (declared beside the records it hands out, so
that the training package reads it without importing this one); a data module of recorded rollouts is none, and the
module trains on its batches as they are. With dynamic sampling the step asks for ``further_rollouts`` of the loader's
next prompts, round by round; an evaluation batch is sampled by ``eval_rollouts``.
"""

from __future__ import annotations

from evolrl.rollout.engine import RolloutEngine
from evolrl.settings import require
from evolrl.types import Sampler

__all__ = ["Sampler", "check_engine"]


def check_engine(mismatch_correction: object | None, engine: RolloutEngine, max_staleness: int = 0) -> None:
    """SettingError for a mismatch correction, or off-policy training (``max_staleness >= 1``), with an engine that
    does not report the log-probs it sampled with, and for off-policy training without a correction: the behaviour
    policy's log-probs enter the loss through the correction's importance weights (``evolrl/rollout/supply.py``)."""
    use = "use evolrl.rollout.VLLMEngine or HFEngine with report_logprobs: true"
    if max_staleness:
        require(engine.reports_logprobs, "data.max_staleness", max_staleness,
                allowed=f"0 with {type(engine).__name__}, which does not report the log-probs of the tokens it "
                f"samples: off-policy batches are weighed by the behaviour policy's; {use}")
        require(mismatch_correction is not None, "model.loss.mismatch_correction", mismatch_correction,
                allowed=f"a correction with data.max_staleness={max_staleness} (e.g. class_path: "
                "evolrl.algorithms.TokenTruncate): its importance weights carry the behaviour policy's log-probs")
    require(mismatch_correction is None or engine.reports_logprobs, "GRPOLoss.mismatch_correction",
            mismatch_correction,
            allowed=f"null (no correction) with {type(engine).__name__}, which does not report the log-probs of the "
            f"tokens it samples (the correction weighs tokens by them); {use}")
