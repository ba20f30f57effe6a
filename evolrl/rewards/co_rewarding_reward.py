"""Co-rewarding II (Zhang et al., ICLR 2026, arXiv 2508.00410): the pseudo-label is a slow EMA teacher's majority.

TTRL's label is the policy's own majority, which the policy then reinforces; here it comes from a teacher that trails
the policy (``evolrl/teacher.py``: the average, how it samples, what it costs). A response scores 1 when its answer
is equivalent to the teacher's majority answer on the same prompt, else 0 (Eq. 10); without a teacher answer every
response of the prompt scores 0, as in the authors' code.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
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

    needs_teacher = True
    """The module gives it the teacher's samples of the same prompts: ``reward(batch, teacher=RolloutBatch)``."""

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

    def __call__(self, batch: RolloutBatch, teacher: RolloutBatch | None = None) -> RewardOutput:
        if teacher is None or teacher.num_prompts != batch.num_prompts:
            raise TypeError("CoRewardingReward scores against its teacher: call it with the teacher's samples of the "
                            "same prompts (reward(batch, teacher=...); EvolRLModule does, evolrl/teacher.py)")
        sheet, votes = self.read(batch), self.read(teacher)
        agrees = torch.tensor([[label is not None and a is not None and ok and answers_equivalent(a, label)
                                for a, ok in zip(row, valid)]
                               for row, valid, label in zip(sheet.answers, sheet.valid.tolist(), votes.labels)])
        share = votes.majority.float().mean(dim=1, keepdim=True).expand(agrees.shape)
        return self.output(sheet, agrees.float(), labels=votes.labels, teacher_share=share)
