"""A reward written outside evolrl through its public interface alone: the proof that a reward with state plugs in.

:class:`ParaphraseVote` samples texts of its own and keeps a running statistic in checkpoints. For each prompt the
policy rewrites the question once, answers its rewrite ``answer_samples`` times, and the majority of those answers is
the pseudo-label every original response is scored against (1 when equivalent, else 0). The running statistic is
how often the rewrite's majority agreed with the original responses' majority. docs/method.md ("Writing a reward")
walks through it; ``config: model.reward.class_path: outside_rewards.ParaphraseVote`` selects it.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch

from evolrl.rewards import AnswerReward, AnswerRules, RewardContext, answers_equivalent
from evolrl.types import Prompt, RewardOutput, RolloutBatch

REWRITE = "Rewrite this question in other words, without solving it: {question}"


class ParaphraseVote(AnswerReward):
    """``r = 1`` if the response's answer is the majority answer to the policy's own rewrite of its question.

    Args:
        answers: How answers are read.
        answer_samples: Answers sampled for each rewritten question.
    """

    samples = True  # the rewrites and their answers come from the run's engine
    keeps_state = True  # the running agreement, in every checkpoint

    components = MappingProxyType({**AnswerReward.components,
                                   "rewrite_agrees": "bool: the rewrite's majority equals the original majority"})

    def __init__(self, answers: AnswerRules = AnswerRules(), answer_samples: int = 2) -> None:  # noqa: B008
        super().__init__(answers)
        if not isinstance(answer_samples, int) or answer_samples < 1:
            raise ValueError(f"ParaphraseVote.answer_samples={answer_samples!r}: an integer >= 1")
        self.answer_samples = answer_samples
        self.agreed, self.seen = 0, 0

    def before_step(self, context: RewardContext) -> dict[str, float]:
        return {"rewrite_agreement": self.agreed / self.seen if self.seen else 0.0}

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        if context is None or context.sampler is None:
            raise TypeError("ParaphraseVote samples through the run: call it with the run's RewardContext")
        prompts = [g.prompt for g in batch.groups]
        asks = [Prompt(f"{p.id}/rewrite", REWRITE.format(question=p.question)) for p in prompts]
        rewrites = context.generate(asks, [context.encode(a.question) for a in asks], n=1,
                                    seed=context.seed_for("rewrite", context.step, prompts[0].id))
        questions = [Prompt(f"{p.id}/rewritten", g.texts[0]) for p, g in zip(prompts, rewrites)]
        answered = context.generate(questions, [context.encode(q.question) for q in questions],
                                    n=self.answer_samples, seed=context.seed_for("answer", context.step, prompts[0].id))
        sheet = self.read(batch)
        votes = self.read(RolloutBatch(tuple(answered), weights_version=batch.weights_version))
        agrees = torch.tensor([[label is not None and a is not None and ok and answers_equivalent(a, label)
                                for a, ok in zip(row, valid)]
                               for row, valid, label in zip(sheet.answers, sheet.valid.tolist(), votes.labels)])
        same = [a is not None and b is not None and answers_equivalent(a, b) for a, b in zip(sheet.labels, votes.labels)]
        self.agreed, self.seen = self.agreed + sum(same), self.seen + len(same)
        rows = torch.tensor(same)[:, None].expand(agrees.shape)
        return self.output(sheet, agrees.float(), labels=votes.labels, rewrite_agrees=rows)

    def state_dict(self) -> dict[str, Any]:
        return {"rewrite_votes": {"agreed": self.agreed, "seen": self.seen}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rewrite_votes" in state:
            self.agreed, self.seen = state["rewrite_votes"]["agreed"], state["rewrite_votes"]["seen"]
