"""What a reward keeps beyond one step, for the module: Co-rewarding's EMA teacher and RESTRAIN's prompt weights.

Both are checked when ``fit`` sets up (what they cannot run with is refused there, naming the setting), built when
training starts (the teacher from the policy's weights then; the prompt weights by the base model's pass, unless a
checkpoint brought them), used by every step, and saved in every checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from evolrl.checkpoints.job import say
from evolrl.checkpoints.preemption import stop_point
from evolrl.data.consistency import measure_shares
from evolrl.rewards.base import Reward
from evolrl.settings import require
from evolrl.teacher import EMATeacher, decay_at, teacher_sampler
from evolrl.types import RolloutBatch


class RewardState:
    """The teacher and prompt weights of ``reward`` where it has them (module docstring)."""

    def __init__(self, reward: Any) -> None:
        self.reward = reward
        self.teacher: EMATeacher | None = None
        self.restored: dict[str, Any] = {}
        self.teaches = getattr(reward, "needs_teacher", False)
        self.weighs = getattr(reward, "prompt_weights", None) is not None
        self.seconds = 0.0

    def check(self, module: Any, data: Any, trainer: Any) -> None:
        """SettingError for what the teacher or the prompt weights' pass cannot run with."""
        name = type(self.reward).__name__
        overlong = getattr(module, "overlong", None)
        if overlong is not None and not overlong.masks():
            require(type(self.reward).advantages is Reward.advantages, "model.overlong", type(overlong).__name__,
                    allowed=f"null or evolrl.algorithms.OverlongMask with {name}, whose advantages are not its "
                    "rewards' (a penalty on the rewards would not reach them)")
        for needed, what in ((self.teaches, "its EMA teacher samples"),
                             (self.weighs, "its prompt weights are measured (PromptWeights)")):
            if not needed:
                continue
            require(hasattr(data, "rollouts"), "data", type(data).__name__,
                    allowed=f"a data module that samples (evolrl.data.RolloutDataModule): {name}: {what} through "
                    "the run's engine")
            require(getattr(data, "sampler_process", None) is None, "data.sampler_process", data.sampler_process,
                    allowed=f"null with {name}: {what} through the engine in the trainer's process")
        if self.teaches:
            require(data.max_staleness == 0, "data.max_staleness", data.max_staleness,
                    allowed=f"0 with {name}: the teacher follows the policy that sampled the step's batch")
            strategy = type(trainer.strategy).__name__
            require("FSDP" not in strategy and "ModelParallel" not in strategy, "trainer.strategy", strategy,
                    allowed=f"one that does not shard the policy (auto, ddp) with {name}: the EMA teacher swaps whole "
                    "tensors into the policy's parameters")

    def start(self, policy: Any, data: Any, trainer: Any) -> None:
        """Build the teacher (from the checkpoint's, when resumed) and the prompt weights, before the first step."""
        if self.teaches and self.teacher is None:
            self.teacher = EMATeacher(policy)
            if "teacher" in self.restored:
                self.teacher.load_state_dict(self.restored["teacher"])
        if self.weighs and not self.reward.weights:
            shares = self.restored.get("prompt_shares")
            if shares is None:
                require(trainer.global_step == 0, "--ckpt_path", trainer.global_step,
                        allowed="a checkpoint that holds RESTRAIN's prompt weights (its base-model pass needs the "
                        "base model's weights, which a resumed policy no longer has)")
                shares = measure_shares(data, self.reward.prompt_weights.samples, self.reward.answers,
                                        trainer.default_root_dir, trainer.global_rank, trainer.world_size,
                                        stop_point=partial(stop_point, trainer), say=say)
            self.reward.set_prompt_weights(shares)

    def before_step(self, policy: Any, trainer: Any, step: int
                    ) -> tuple[Callable[[RolloutBatch], RolloutBatch] | None, dict[str, float]]:
        """The step's teacher sampler (the teacher moved towards the policy that sampled the step) and its stats."""
        if self.teacher is None:
            return None, {}
        data = trainer.datamodule
        decay = decay_at(step, total_steps(trainer), self.reward.decay, self.reward.final_decay)
        self.teacher.update(policy, decay)
        samples = self.reward.teacher_samples or data.rollouts.vote_samples
        sample = teacher_sampler(self.teacher, policy, data.rollouts, samples, step)
        self.seconds = 0.0

        def timed(batch: RolloutBatch) -> RolloutBatch:
            start = time.perf_counter()
            try:
                return sample(batch)
            finally:
                self.seconds += time.perf_counter() - start

        return timed, {"teacher_decay": decay}

    def timings(self) -> dict[str, float]:
        """The step's seconds of teacher sampling (its pushes included), once it has a teacher."""
        return {"teacher": self.seconds} if self.teacher is not None else {}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.teacher is not None:
            state["teacher"] = self.teacher.state_dict()
        if self.weighs and self.reward.shares:
            state["prompt_shares"] = dict(self.reward.shares)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = {k: state[k] for k in ("teacher", "prompt_shares") if k in state}
        if self.teacher is not None and "teacher" in state:
            self.teacher.load_state_dict(state["teacher"])
        if self.weighs and "prompt_shares" in state:
            self.reward.set_prompt_weights(state["prompt_shares"])


def total_steps(trainer: Any) -> int:
    """The run's training steps, for the teacher's schedule (one rollout batch each)."""
    total = trainer.estimated_stepping_batches
    return int(total) if math.isfinite(total) else trainer.max_steps
