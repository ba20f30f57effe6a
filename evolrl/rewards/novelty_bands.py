"""EVOL-RL's novelty bands as one configured object: the embedder, ``alpha`` and ``novelty_text``.

:class:`NoveltyBands` embeds the valid responses of a training step in one call and maps their
novelty (:mod:`evolrl.rewards.novelty`) to non-overlapping reward bands around a selected set
(the majority for :class:`~evolrl.rewards.EvolReward`, the correct answers for
:class:`~evolrl.rewards.VerifierReward`). The novelty settings are declared here only; the rewards
take one ``NoveltyBands``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from evolrl.rewards.answers import final_part, strip_last_boxed
from evolrl.rewards.embedders import Embedder, SentenceTransformerEmbedder
from evolrl.rewards.novelty import band_rewards, novelty_scores
from evolrl.settings import check_choice, check_float, require
from evolrl.types import RolloutBatch

NoveltyText = Literal["response", "reasoning"]
NOVELTY_TEXTS: tuple[str, ...] = ("response", "reasoning")


class NoveltyBands:
    """Embeds the valid responses of a step in one call and turns novelty into reward bands.

    Selected responses (majority, or correct) earn ``[0.5, 1]``, the other valid ones
    ``[-1, -0.5]``, invalid ones ``-1``; the more novel a response within its group, the higher.

    Args:
        embedder: Sentence embedder; ``None`` means the packaged all-MiniLM-L6-v2
            (the paper used ``Qwen/Qwen3-Embedding-4B``).
        alpha: Weight of the intra-group mean similarity against the max similarity, in [0, 1].
        novelty_text: ``response``: the text after ``</think>`` (or all of it);
            ``reasoning``: the same without its final boxed answer.
    """

    def __init__(self, embedder: Embedder | None = None, alpha: float = 0.5, novelty_text: NoveltyText = "response"):
        require(embedder is None or isinstance(embedder, Embedder), "NoveltyBands.embedder", embedder,
                "an evolrl.rewards.Embedder (e.g. SentenceTransformerEmbedder) or null for the packaged MiniLM")
        check_float("NoveltyBands.alpha", alpha, 0.0, 1.0)
        check_choice("NoveltyBands.novelty_text", novelty_text, NOVELTY_TEXTS)
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
