"""Co-rewarding II (Zhang et al., ICLR 2026, arXiv 2508.00410): the pseudo-label is a slow EMA teacher's majority.

TTRL's label is the policy's own majority, which the policy then reinforces; here it comes from a teacher that trails
the policy (``teacher.py``: the average, how it samples, what it costs). A response scores 1 when its answer
is equivalent to the teacher's majority answer on the same prompt, else 0 (Eq. 10); without a teacher answer every
response of the prompt scores 0, as in the authors' code.
"""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Any

import torch

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.co_rewarding.teacher import EMATeacher, decay_at, teacher_sampler
from evolrl.rewards.context import RewardContext
from evolrl.rewards.equivalence import answers_equivalent
from evolrl.settings import check_float, check_int, require
from evolrl.types import RewardOutput, RolloutBatch


class CoRewardingReward(AnswerReward):
    """``r = 1`` if the answer is equivalent to the EMA teacher's majority answer on the prompt, else ``0``.

    Args:
        answers: How answers are read, the teacher's and the policy's alike.
        decay: The teacher's decay at the first step (``teacher <- decay * teacher + (1 - decay) * policy``), in (0, 1).
        final_decay: The decay at the last step, reached by a cosine; ``null``: ``decay`` throughout. 0.99999, as the
            authors' released script anneals the EMA's alpha from 0.01 to 1e-5.
        teacher_samples: Teacher responses per prompt for its vote; ``null``: as many as the policy's (V).
    """

    samples = True
    """The teacher samples the step's prompts through the run's engine."""
    keeps_state = True
    """The teacher's tensors."""

    components = MappingProxyType({
        **AnswerReward.components,
        "teacher_share": "float: the share of the teacher's responses on its prompt that hold the teacher's label",
    })

    def __init__(self, answers: AnswerRules = EVERY_ANSWER, decay: float = 0.99, final_decay: float | None = 0.99999,
                 teacher_samples: int | None = None) -> None:
        super().__init__(answers)
        check_float("CoRewardingReward.decay", decay, 0.0, 1.0, low_open=True, high_open=True)
        if final_decay is not None:
            check_float("CoRewardingReward.final_decay", final_decay, 0.0, 1.0, low_open=True, high_open=True)
        require(teacher_samples is None or isinstance(teacher_samples, int), "CoRewardingReward.teacher_samples",
                teacher_samples, allowed="null (as many as the policy's) or an integer >= 1")
        if teacher_samples is not None:
            check_int("CoRewardingReward.teacher_samples", teacher_samples, 1)
        self.decay, self.final_decay, self.teacher_samples = decay, final_decay, teacher_samples
        self.teacher: EMATeacher | None = None
        self.restored: dict[str, torch.Tensor] | None = None
        self.sample = None
        self.seconds = 0.0

    def check(self, context: RewardContext) -> None:
        super().check(context)
        name, settings = type(self).__name__, context.settings
        require(settings.get("max_staleness", 0) == 0, "data.max_staleness", settings.get("max_staleness"),
                allowed=f"0 with {name}: the teacher follows the policy that sampled the step's batch")
        require(not settings.get("sharded", False), "trainer.strategy", settings.get("strategy"),
                allowed=f"one that does not shard the policy (auto, ddp) with {name}: the EMA teacher swaps whole "
                "tensors into the policy's parameters")

    def start(self, context: RewardContext) -> None:
        """The teacher from the policy's trainable tensors, or the checkpoint's."""
        if self.teacher is None:
            self.teacher = EMATeacher(context.model)
            if self.restored is not None:
                self.teacher.load_state_dict(self.restored)

    def before_step(self, context: RewardContext) -> dict[str, float]:
        """The teacher moved towards the policy that sampled the step (Eq. 11), and its sampler for the step."""
        decay = decay_at(context.step, context.total_steps, self.decay, self.final_decay)
        self.teacher.update(context.model, decay)
        samples = self.teacher_samples or context.vote_samples
        self.sample = teacher_sampler(self.teacher, context.model, context.sampler.rollouts, samples, context.step)
        self.seconds = 0.0
        return {"teacher_decay": decay}

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        if self.sample is None:
            raise TypeError("CoRewardingReward scores against its teacher, which samples through the run: train it "
                            "with EvolRLModule, or score given teacher samples with CoRewardingReward.against")
        start = time.perf_counter()
        try:
            teacher = self.sample(batch)
        finally:
            self.seconds += time.perf_counter() - start
        return self.against(batch, teacher)

    def against(self, batch: RolloutBatch, teacher: RolloutBatch) -> RewardOutput:
        """Eq. 10 for ``batch``, given the teacher's samples of the same prompts."""
        if teacher.num_prompts != batch.num_prompts:
            raise ValueError(f"CoRewardingReward: {teacher.num_prompts} teacher groups for {batch.num_prompts} prompts")
        sheet, votes = self.read(batch), self.read(teacher)
        agrees = torch.tensor([[label is not None and a is not None and ok and answers_equivalent(a, label)
                                for a, ok in zip(row, valid)]
                               for row, valid, label in zip(sheet.answers, sheet.valid.tolist(), votes.labels)])
        share = votes.majority.float().mean(dim=1, keepdim=True).expand(agrees.shape)
        return self.output(sheet, agrees.float(), labels=votes.labels, teacher_share=share)

    def timings(self) -> dict[str, float]:
        """The step's seconds of teacher sampling (its pushes included)."""
        return {"teacher": self.seconds} if self.teacher is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {"teacher": self.teacher.state_dict()} if self.teacher is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = state.get("teacher")
        if self.teacher is not None and self.restored is not None:
            self.teacher.load_state_dict(self.restored)
