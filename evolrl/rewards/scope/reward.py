"""SCOPE (Wang et al. 2025, arXiv 2512.15146): each subgroup of a prompt's responses votes for its own label, a vote
weighed by the response's step-wise confidence.

A response's weight is its average-step confidence (``confidence.py``); the subgroup size is chosen on every call by
the Pareto search of ``subgroups.py``; a response scores 1 when its answer is its subgroup's label, else 0. Nothing
of the trainer is needed beyond the hooks every reward has: the sampler's token log-probs come with the batch, the
tokenizer and the seeds of the draws through the run's context.

Where this differs from the authors (docs/method.md 4.6): the token measure is the sampled token's log-prob, not
the mean of the top-k (the engines report the sampled token only), and by default it is turned into a weight that
grows with confidence, where the released code weighs by surprisal (``weight``); the size chosen keeps the labels
it was chosen on, where the released code draws them again; answers are grouped by math equivalence.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward
from evolrl.rewards.context import RewardContext
from evolrl.rewards.scope.confidence import STEP_END, WEIGHTS, token_texts, vote_weight
from evolrl.rewards.scope.subgroups import pareto_choice, partition, sizes
from evolrl.rewards.voting import majority_class
from evolrl.settings import check_choice, check_float, check_int, require
from evolrl.types import RewardOutput, RolloutBatch


class ScopeReward(AnswerReward):
    """``r = 1`` if the answer is its subgroup's confidence-weighted label, else ``0`` (module docstring).

    Args:
        answers: How answers are read.
        votes: Responses drawn for each subgroup's vote; ``null``: half the group (the authors' 32 of 64).
        lam: Weight of the mean reward against label diversity in the choice of the subgroup size.
        weight: ``certainty`` (geometric-mean token probability) or ``surprisal`` (the released code's).
    """

    components = MappingProxyType({
        **AnswerReward.components,
        "majority": "bool: its answer is its subgroup's label",
        "confidence": "float: its weight in the votes (its step-averaged confidence)",
        "subgroup_size": "float: the subgroup size chosen for the step",
    })

    def __init__(self, answers: AnswerRules = EVERY_ANSWER, votes: int | None = None, lam: float = 0.7,
                 weight: str = "certainty", step_end: str = STEP_END) -> None:
        super().__init__(answers)
        require(votes is None or isinstance(votes, int), "ScopeReward.votes", votes,
                allowed="null (half the group) or an integer >= 1")
        if votes is not None:
            check_int("ScopeReward.votes", votes, 1)
        check_float("ScopeReward.lam", lam, 0.0, 1.0)
        check_choice("ScopeReward.weight", weight, WEIGHTS)
        require(isinstance(step_end, str) and step_end != "", "ScopeReward.step_end", step_end,
                allowed="a non-empty string that ends a reasoning step")
        self.votes, self.lam, self.weight, self.step_end = votes, lam, weight, step_end
        self._texts: dict[int, str] = {}

    def check(self, context: RewardContext) -> None:
        super().check(context)
        require(context.settings.get("sampler_logprobs") is not False, "data.engine",
                context.settings.get("engine"), allowed="an engine that reports each sampled token's log-prob "
                "(VLLMEngine; HFEngine with report_logprobs: true): ScopeReward weighs votes by them")
        group = context.settings.get("vote_samples")
        if self.votes is not None and group is not None:
            require(self.votes <= group, "ScopeReward.votes", self.votes,
                    allowed=f"at most data.rollouts.vote_samples ({group}): the votes are drawn from the group")

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        if context is None or context.tokenizer is None:
            raise TypeError("ScopeReward reads the sampled tokens through the run's tokenizer: train it with "
                            "EvolRLModule, or score given weights with ScopeReward.against")
        missing = [g.prompt.id for g in batch.groups if not g.sampler_logprobs]
        if missing:
            raise ValueError(f"ScopeReward: the rollouts of prompt {missing[0]!r} carry no sampler log-probs; "
                             "sample with an engine that reports them (VLLMEngine, HFEngine(report_logprobs=True))")
        decode = context.tokenizer.decode
        weights = torch.tensor([[vote_weight(lp, token_texts(decode, ids, self._texts), self.weight, self.step_end)
                                 for lp, ids in zip(g.sampler_logprobs, g.response_ids)] for g in batch.groups])
        generator = torch.Generator().manual_seed(context.seed_for("scope", context.step, context.call))
        return self.against(batch, weights, generator)

    def against(self, batch: RolloutBatch, weights: torch.Tensor, generator: torch.Generator) -> RewardOutput:
        """The rewards of ``batch`` given each response's vote weight (``[P, V]``) and the draws' generator."""
        group = batch.group_size
        votes = self.votes or max(1, group // 2)
        if votes > group:
            raise ValueError(f"ScopeReward.votes={votes} is more than the group's {group} responses")
        sheet = self.read(batch)
        classes = [[None if c < 0 else c for c in row] for row in sheet.answer_class.tolist()]
        chosen = pareto_choice([partition(classes, weights, m, votes, generator) for m in sizes(group)], self.lam)
        labels = tuple(_label(sheet.answers[p], classes[p], chosen.labels[p]) for p in range(batch.num_prompts))
        size = torch.full((batch.num_prompts, group), float(chosen.size))
        return self.output(sheet, chosen.rewards, labels=labels, majority=chosen.rewards.bool(),
                           confidence=weights.float(), subgroup_size=size)


def _label(answers: tuple[str | None, ...], classes: list[int | None], labels: list[int | None]) -> str | None:
    """A prompt's label for the diagnostics: the class most of its responses' subgroups chose, as first written."""
    best = majority_class(labels)
    return None if best is None else answers[classes.index(best)]
