"""The reward interface and the steps every reward shares.

A reward maps a :class:`~evolrl.types.RolloutBatch` (``P`` prompts x ``V``
responses) to a :class:`~evolrl.types.RewardOutput`: ``[P, V]`` rewards plus
named components. Subclass :class:`Reward` and select it by ``class_path`` in a
config to plug in another one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from evolrl.rewards.answers import (
    VALID_RULES,
    ValidRule,
    extract_answer,
    final_part,
    is_valid_response,
    strip_last_boxed,
)
from evolrl.rewards.embedders import Embedder, SentenceTransformerEmbedder
from evolrl.rewards.majority import group_answers, majority_class
from evolrl.rewards.novelty import band_rewards, novelty_scores
from evolrl.types import RewardOutput, RolloutBatch

NoveltyText = Literal["response", "reasoning"]


class Reward(ABC):
    """Scores every response of a rollout batch."""

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        """Rewards ``[P, V]`` and their components for ``batch``."""


class AnswerReward(Reward):
    """Shared answer handling: extraction, validity and equivalence classes per prompt.

    Args:
        valid_rule: ``digit`` (paper: a boxed answer containing a digit), ``nonempty`` or ``any``.
        number_fallback: Read the last number as the answer when a response has no ``\\boxed{}``
            (it then also counts as boxed for validity).
    """

    def __init__(self, valid_rule: ValidRule = "digit", number_fallback: bool = False) -> None:
        if valid_rule not in VALID_RULES:
            raise ValueError(f"valid_rule={valid_rule!r} is not one of {', '.join(VALID_RULES)}")
        self.valid_rule = valid_rule
        self.number_fallback = number_fallback

    def read(self, batch: RolloutBatch) -> AnswerSheet:
        """Answers, validity and the majority vote of every prompt (over valid answers only)."""
        answers = tuple(tuple(extract_answer(t, self.number_fallback) for t in texts) for texts in batch.texts)
        valid = [[is_valid_response(t, self.valid_rule, self.number_fallback) for t in texts] for texts in batch.texts]
        classes = [group_answers([a if ok else None for a, ok in zip(*row)]) for row in zip(answers, valid)]
        winners = [majority_class(row) for row in classes]
        return AnswerSheet(
            answers=answers,
            valid=torch.tensor(valid, dtype=torch.bool),
            answer_class=torch.tensor([[-1 if c is None else c for c in row] for row in classes], dtype=torch.long),
            majority=torch.tensor([[w is not None and c == w for c in row] for row, w in zip(classes, winners)]),
            labels=tuple(None if w is None else ans[row.index(w)] for ans, row, w in zip(answers, classes, winners)),
        )


@dataclass(frozen=True)
class AnswerSheet:
    """What :meth:`AnswerReward.read` finds in a batch; tensors are ``[P, V]``."""

    answers: tuple[tuple[str | None, ...], ...]
    valid: Tensor
    answer_class: Tensor
    """Equivalence class of each valid answer in order of first appearance, -1 for none."""
    majority: Tensor
    labels: tuple[str | None, ...]
    """Majority label per prompt (its first member as written), ``None`` without valid answers."""


class NoveltyBands:
    """Embeds the valid responses of a step in one call and turns novelty into reward bands.

    Args:
        embedder: Sentence embedder; ``None`` means the packaged all-MiniLM-L6-v2.
        alpha: Weight of the intra-group mean similarity against the max similarity.
        novelty_text: ``response``: the text after ``</think>`` (or all of it);
            ``reasoning``: the same without its final boxed answer.
    """

    def __init__(self, embedder: Embedder | None = None, alpha: float = 0.5, novelty_text: NoveltyText = "response"):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in [0, 1]")
        if novelty_text not in ("response", "reasoning"):
            raise ValueError(f"novelty_text={novelty_text!r} must be 'response' or 'reasoning'")
        self.embedder = embedder if embedder is not None else SentenceTransformerEmbedder()
        self.alpha = alpha
        self.novelty_text = novelty_text

    def text_for_novelty(self, response: str) -> str:
        part = final_part(response)
        return strip_last_boxed(part) if self.novelty_text == "reasoning" else part

    def embed(self, batch: RolloutBatch, valid: Tensor) -> Tensor:
        """``[P, V, D]`` embeddings; zeros at invalid responses, which are never embedded."""
        positions = valid.nonzero().tolist()
        if not positions:
            return torch.zeros(*valid.shape, 1)
        texts = [self.text_for_novelty(batch.groups[p].texts[v]) for p, v in positions]
        vectors = self.embedder.embed(texts)  # [N_valid, D]
        out = torch.zeros(*valid.shape, vectors.shape[-1], dtype=vectors.dtype)
        out[valid] = vectors  # nonzero() and boolean indexing share row-major order
        return out

    def __call__(self, batch: RolloutBatch, selected: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """``(rewards, novelty)``, each ``[P, V]``; ``selected`` marks the upper band (majority or correct)."""
        novelty = novelty_scores(self.embed(batch, valid), selected, valid, self.alpha)
        return band_rewards(novelty, selected, valid), novelty
