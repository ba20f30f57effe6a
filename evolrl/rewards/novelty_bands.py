"""EVOL-RL's novelty bands as one configured object: the embedder, ``alpha`` and ``novelty_text``.

:class:`NoveltyBands` embeds the valid responses of a training step in one call and maps their
novelty (:mod:`evolrl.rewards.novelty`) to non-overlapping reward bands around a selected set
(the majority for :class:`~evolrl.rewards.EvolReward`, the correct answers for
:class:`~evolrl.rewards.VerifierReward`). The novelty settings are declared here only; the rewards
take one ``NoveltyBands``.

Which text is embedded (``novelty_text``): the paper embeds "the reasoning part of each response" (its section 3.2
and the appendix on the novelty score) without saying where that part ends; the default, ``response``, embeds the
whole response (after ``</think>`` when there is one). That suits reasoning traces, where two responses with the
same answer differ in how they got there. When the answer is one line ("9 + 11 = 20"), the only way for a response
to be novel is text written *after* the answer, and the min-max normalization inside a group stretches that
difference, however meaningless, over the whole band: the reward pays for trailing text and ranks the clean answer
last whenever the group agrees. ``until_answer``, a narrower reading of "the reasoning part", embeds the response
only up to where it first states the answer it is graded on as a result (``statements.first_statement``: a box holding
it, or the number after ``=``, "is" or an answer marker; not the number as an operand, "0 + 36 = 36"), whatever the
answer-reading rules, without the answer and without anything after it: neither trailing text nor a restatement
("15 + 21 = 36 So, 15 + 21 = 36.") can change a response's novelty.
A response with no answer (valid only under ``answers.valid_rule: any``) is embedded whole. A response that is only its
answer ("\\boxed{20}") is embedded as the empty string: all such responses share one embedding, so they are
equally novel among themselves (a group of them alone gets the middle of its band).

Why ``min_spread`` (beyond the paper, off by default): min-max scaling gives a group's least and most novel response
the ends of its band whatever their gap. In Study IV (25-token answers) cosine gaps of 0.01-0.03 were stretched over
the whole band, and responses with a false step ("3 + 3 + 3 = 6. 6 + 3 = 9.") earned up to 0.75 in the majority
band. Below ``min_spread`` a group is scaled by the floor instead, so its rewards span only ``spread / min_spread``
of the band, around its middle (docs/method.md section 2). Each group's raw spread is logged either way (the
``novelty_spread`` component, ``train/novelty_spread_mean``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from evolrl.rewards.answers import AnswerSpan, answer_offset, final_part, strip_last_boxed
from evolrl.rewards.embedders import Embedder, SentenceTransformerEmbedder
from evolrl.rewards.novelty import band_rewards, novelty_spread, novelty_values
from evolrl.settings import check_choice, check_float, require
from evolrl.types import RolloutBatch

NoveltyText = Literal["response", "reasoning", "until_answer"]
NOVELTY_TEXTS: tuple[str, ...] = ("response", "reasoning", "until_answer")
NOVELTY = "float: EVOL-RL's novelty u (NaN where not embedded)"
"""What the ``novelty`` component of a reward with novelty bands holds."""
NOVELTY_SPREAD = "float: max u - min u of its group (selected or not) before scaling (NaN: invalid, group of one)"
NOVELTY_COMPONENTS = {"novelty": NOVELTY, "novelty_spread": NOVELTY_SPREAD}
"""The components a reward with novelty bands declares."""


class NoveltyBands:
    """Embeds the valid responses of a step in one call and turns novelty into reward bands.

    Selected responses (majority, or correct) earn ``[0.5, 1]``, the other valid ones
    ``[-1, -0.5]``, invalid ones ``-1``; the more novel a response within its group, the higher.

    Args:
        embedder: Sentence embedder; ``None`` means the packaged all-MiniLM-L6-v2
            (the paper used ``Qwen/Qwen3-Embedding-4B``).
        alpha: Weight of the intra-group mean similarity against the max similarity, in [0, 1].
        novelty_text: ``response``: the text after ``</think>`` (or all of it);
            ``reasoning``: the same without its final boxed answer; ``until_answer``: the same up to where
            it first states its answer, without the answer and anything after it (module docstring).
        min_spread: Beyond the paper: a group whose raw novelty spread is below this is scaled by it instead of
            min-max, so a small spread stays small in the band (module docstring); in (0, 1]; ``null``: the paper.
    """

    def __init__(self, embedder: Embedder | None = None, alpha: float = 0.5, novelty_text: NoveltyText = "response",
                 min_spread: float | None = None):
        require(embedder is None or isinstance(embedder, Embedder), "NoveltyBands.embedder", embedder,
                allowed="an evolrl.rewards.Embedder (e.g. SentenceTransformerEmbedder) or null for the packaged MiniLM")
        check_float("NoveltyBands.alpha", alpha, low=0.0, high=1.0)
        check_choice("NoveltyBands.novelty_text", novelty_text, NOVELTY_TEXTS)
        if min_spread is not None:
            check_float("NoveltyBands.min_spread", min_spread, low=0.0, high=1.0, low_open=True)
        self.embedder = embedder if embedder is not None else SentenceTransformerEmbedder()
        self.alpha = alpha
        self.novelty_text = novelty_text
        self.min_spread = min_spread

    def text_for_novelty(self, response: str, span: AnswerSpan | None = None) -> str:
        """The text embedded for ``response``; ``span``: where it first states its answer (``until_answer`` only)."""
        if self.novelty_text == "until_answer":
            return response[answer_offset(response) : span.start] if span is not None else final_part(response)
        part = final_part(response)
        return strip_last_boxed(part) if self.novelty_text == "reasoning" else part

    def embed(self, batch: RolloutBatch, valid: Tensor,
              spans: Sequence[Sequence[AnswerSpan | None]] | None = None) -> Tensor:
        """``[P, V, D]`` embeddings; zeros at invalid responses, which are never embedded."""
        if self.novelty_text == "until_answer" and spans is None:
            raise ValueError("NoveltyBands(novelty_text='until_answer') embeds up to each response's answer: pass "
                             "where each response first states its answer (AnswerSheet.stated)")
        positions = valid.nonzero().tolist()
        if not positions:
            return torch.zeros(*valid.shape, 1)
        texts = [self.text_for_novelty(batch.groups[p].texts[v], spans[p][v] if spans is not None else None)
                 for p, v in positions]
        vectors = self.embedder.embed(texts)  # [N_valid, D]
        out = torch.zeros(*valid.shape, vectors.shape[-1], dtype=vectors.dtype)
        out[valid] = vectors  # nonzero() and boolean indexing share row-major order
        return out

    def __call__(self, batch: RolloutBatch, selected: Tensor, valid: Tensor,
                 spans: Sequence[Sequence[AnswerSpan | None]] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """``(rewards, components)``: the ``[P, V]`` rewards and the ``novelty`` and ``novelty_spread`` components;
        ``selected`` marks the upper band (majority or correct); ``spans``: where each response first states its
        answer, ``[P][V]`` (needed by ``until_answer``)."""
        novelty = novelty_values(self.embed(batch, valid, spans), selected, is_valid=valid, alpha=self.alpha)
        rewards = band_rewards(novelty, selected, valid, self.min_spread)
        return rewards, {"novelty": novelty, "novelty_spread": novelty_spread(novelty, selected, valid)}
