"""Where a run calls its reward's hooks, with the :class:`~evolrl.rewards.RewardContext` it builds: one path for
every reward, so a reward with state (a teacher, a measuring pass, a running statistic) plugs in by ``class_path``
without a line here naming it (``evolrl/rewards/base.py`` lists the hooks and when each is called).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from evolrl.checkpoints.job import say
from evolrl.checkpoints.preemption import stop_point
from evolrl.rewards import Reward, RewardContext


def reward_context(module: Any, data: Any, trainer: Any) -> RewardContext:
    """The context of the run ``module``, ``data`` and ``trainer`` make (before anything loads: no policy yet)."""
    samples = hasattr(data, "rollouts")  # a data module that samples, not recorded rollouts
    strategy = type(trainer.strategy).__name__
    settings = {"max_staleness": getattr(data, "max_staleness", 0), "sampler_process": getattr(data, "sampler_process",
                None), "strategy": strategy, "sharded": "FSDP" in strategy or "ModelParallel" in strategy,
                "overlong": getattr(module, "overlong", None)}
    rollouts = getattr(data, "rollouts", None)
    engine = getattr(rollouts, "engine", None)
    settings.update(engine=type(engine).__name__ if engine is not None else None,
                    sampler_logprobs=getattr(engine, "reports_logprobs", None),
                    vote_samples=getattr(rollouts, "vote_samples", None))
    return RewardContext(run_dir=Path(trainer.default_root_dir), seed=data.seeds.seed if samples else 0,
                         rank=trainer.global_rank, world_size=trainer.world_size, model=module.policy,
                         sampler=data if samples else None, tokenizer=getattr(data, "tokenizer", None),
                         settings=settings, say=say,
                         stop_point=partial(stop_point, trainer))


class RewardHooks:
    """The run's reward and the context its hooks get (module docstring)."""

    def __init__(self, reward: Reward) -> None:
        self.reward = reward
        self.context = RewardContext()

    def check(self, module: Any, data: Any, trainer: Any) -> None:
        """The reward's settings against the run's (a SettingError naming the setting)."""
        self.reward.check(reward_context(module, data, trainer))

    def start(self, module: Any, trainer: Any) -> None:
        """The context of this start, and the reward's :meth:`~evolrl.rewards.Reward.start`."""
        self.context = replace(reward_context(module, trainer.datamodule, trainer), step=trainer.global_step,
                               total_steps=total_steps(trainer))
        self.reward.start(self.context)

    def before_step(self, step: int) -> dict[str, float]:
        self.context.step, self.context.call = step, 0
        return self.reward.before_step(self.context)


def total_steps(trainer: Any) -> int:
    """The run's training steps, for a reward's schedule (one rollout batch each)."""
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else trainer.max_steps
