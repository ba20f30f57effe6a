"""Self-Harmony (Wang et al., ICLR 2026, arXiv 2511.01191): the pseudo-label is the answer that stays when the
question is put in other words.

Before each step's scoring the policy, as the *reframer*, writes one rewrite of every prompt's question; as the
*solver* it answers the rewrite ``reframed_samples`` times. With ``p0(a)`` and ``p1(a)`` the shares of answer class
``a`` among the original view's V responses and the reframed view's, the label is the class with the largest
harmonic mean ``2 p0 p1 / (p0 + p1)`` (the paper's harmonic-mean selector, Theorem 3.2): an answer seen in one view
only scores 0, and a prompt whose views share no answer has no label and gives every response 0. Ties go to the
larger total count, then to the class the original view met first. An original response scores 1 when its answer is
in the label's class, else 0. Everything is sampled through the run's context (``evolrl/rewards/base.py``), so the
reward needs nothing of the trainer beyond the hooks every reward has.

Where this differs from the authors (docs/method.md 4.5): their reframer writes the rewrite and its solution in one
generation, V times, and those responses are trained as a second GRPO group; here one rewrite per prompt is answered
V times and only the original responses are trained, so the reframer is not trained. Their reframing prompt asks
for one of eight named strategies and a three-part layout; the default here is one plain instruction a small model
can follow (``reframe``). Their code groups answers by exact string; here by math equivalence.
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerReward, AnswerSheet
from evolrl.rewards.context import RewardContext
from evolrl.rewards.voting import group_answers
from evolrl.settings import check_int, require
from evolrl.types import Prompt, RewardOutput, RolloutBatch

REFRAME = ("Rewrite the following problem in other words. Keep every number and what is asked; do not solve it. "
           "Reply with the rewritten problem only.\n\n{question}")


class SelfHarmonyReward(AnswerReward):
    """``r = 1`` if the answer is the class with the largest harmonic mean of its shares over the original question
    and the policy's own rewrite of it, else ``0`` (module docstring).

    Args:
        answers: How answers are read, in both views.
        reframe: The reframer's instruction; ``{question}`` is replaced by the prompt's question.
        reframed_samples: Answers sampled for each rewrite; ``null``: as many as the original's (V).
    """

    samples = True
    """The rewrites and their answers are sampled through the run's engine."""

    components = MappingProxyType({
        **AnswerReward.components,
        "harmony": "float: the harmonic mean of its answer class's shares over the two views (0: one view only)",
        "reframed_share": "float: the share of the rewrite's answers in the label's class (0 without a label)",
    })

    def __init__(self, answers: AnswerRules = EVERY_ANSWER, reframe: str = REFRAME,
                 reframed_samples: int | None = None) -> None:
        super().__init__(answers)
        require(isinstance(reframe, str) and "{question}" in reframe, "SelfHarmonyReward.reframe", reframe,
                allowed="an instruction that holds {question}, where the prompt's question goes")
        require(reframed_samples is None or isinstance(reframed_samples, int), "SelfHarmonyReward.reframed_samples",
                reframed_samples, allowed="null (as many as the original's) or an integer >= 1")
        if reframed_samples is not None:
            check_int("SelfHarmonyReward.reframed_samples", reframed_samples, 1)
        self.reframe, self.reframed_samples = reframe, reframed_samples

    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        if context is None or context.sampler is None:
            raise TypeError("SelfHarmonyReward samples the rewrites through the run: train it with EvolRLModule, or "
                            "score given reframed samples with SelfHarmonyReward.against")
        prompts = [g.prompt for g in batch.groups]
        asks = [Prompt(f"{p.id}/reframe", self.reframe.format(question=p.question)) for p in prompts]
        key = (context.step, context.call)  # each of a step's calls (dynamic sampling's rounds) samples anew
        rewrites = context.generate(asks, [context.encode(a.question) for a in asks], n=1,
                                    seed=context.seed_for("self_harmony:reframe", *key))
        reframed = [Prompt(p.id, g.texts[0], p.answer) for p, g in zip(prompts, rewrites)]
        groups = context.generate(reframed, [context.encode(q.question) for q in reframed],
                                  n=self.reframed_samples or batch.group_size,
                                  seed=context.seed_for("self_harmony:solve", *key))
        return self.against(batch, RolloutBatch(tuple(groups), weights_version=batch.weights_version))

    def against(self, batch: RolloutBatch, reframed: RolloutBatch) -> RewardOutput:
        """The rewards of ``batch`` given the solver's answers to each prompt's rewrite (``reframed``, same order)."""
        if reframed.num_prompts != batch.num_prompts:
            raise ValueError(f"SelfHarmonyReward: {reframed.num_prompts} reframed groups for {batch.num_prompts} "
                             "prompts")
        sheet, other = self.read(batch), self.read(reframed)
        rows = [harmonic_label(sheet, other, p) for p in range(batch.num_prompts)]
        labels = tuple(label for label, _, _ in rows)
        rewards = torch.tensor([[float(c == best) if best is not None else 0.0 for c in classes]
                                for _, best, (classes, _, _) in rows])
        harmony = torch.tensor([[scores.get(c, 0.0) for c in classes] for _, _, (classes, scores, _) in rows])
        share = torch.tensor([[shared] * batch.group_size for _, _, (_, _, shared) in rows])
        return self.output(sheet, rewards, labels=labels, harmony=harmony, reframed_share=share)


def harmonic_label(sheet: AnswerSheet, other: AnswerSheet, p: int
                   ) -> tuple[str | None, int | None, tuple[list[int | None], dict[int, float], float]]:
    """Prompt ``p``'s label over its two views: ``(label as first written, its class, (the original responses'
    classes, class -> harmonic mean, the rewrite's share in the label's class))``. Classes are math-equivalence
    classes over both views' valid answers, numbered in order of appearance, the original view first."""
    first = [a if ok else None for a, ok in zip(sheet.answers[p], sheet.valid[p].tolist())]
    second = [a if ok else None for a, ok in zip(other.answers[p], other.valid[p].tolist())]
    classes = group_answers(first + second)
    mine, theirs = classes[: len(first)], classes[len(first):]
    counts0 = {c: mine.count(c) for c in mine if c is not None}
    counts1 = {c: theirs.count(c) for c in theirs if c is not None}
    scores = {}
    for c in counts0.keys() & counts1.keys():
        p0, p1 = counts0[c] / len(mine), counts1[c] / len(theirs)
        scores[c] = 2 * p0 * p1 / (p0 + p1)
    if not scores:
        return None, None, (mine, scores, 0.0)
    best = max(scores, key=lambda c: (scores[c], counts0[c] + counts1[c], -c))  # classes number first meetings
    label = (first + second)[classes.index(best)]
    return label, best, (mine, scores, counts1[best] / len(theirs))
