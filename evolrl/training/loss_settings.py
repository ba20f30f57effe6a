"""The policy-loss settings: clipping, KL, entropy bonus, aggregation, advantage scaling, mismatch correction.

A plain dataclass, so the CLI expands its fields (``model.loss.clip_high``) and checks each where it is declared;
:class:`~evolrl.training.update.GRPOUpdate` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor

from evolrl.algorithms import AGGREGATIONS, CORRECTIONS
from evolrl.algorithms.mismatch import correction_weights, mismatch_sums
from evolrl.settings import check_choice, check_float
from evolrl.training.sequences import Sequences


@dataclass
class GRPOLoss:
    """Policy-loss settings (EVOL-RL defaults; TTRL uses ``clip_high=0.2, entropy_coef=0``)."""

    clip_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - clip_low``."""
    clip_high: float = 0.28
    """Upper clip range, ``1 + clip_high`` (EVOL-RL's asymmetric clip; TTRL 0.2)."""
    dual_clip: float | None = 3.0
    """Cap on the loss of a negative-advantage token, ``-A * dual_clip``; ``null`` turns it off."""
    kl_coef: float = 0.001
    """Weight of the low-variance KL to the initial policy; 0 drops the reference model."""
    entropy_coef: float = 0.003
    """Weight of the entropy bonus (EVOL-RL 0.003; TTRL 0)."""
    aggregation: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """``token_mean`` over the mini-batch's response tokens, or the paper's per-sequence mean."""
    scale_by_std: bool = True
    """Divide advantages by the group's std (GRPO); ``false`` is Dr. GRPO."""
    mismatch_correction: Literal["token_truncate", "sequence_mask"] | None = None
    """Weigh each token's policy-gradient loss for the sampler/trainer gap (needs an engine that reports log-probs,
    e.g. vLLM; ``fit`` refuses others at start). ``null``: none (the paper's code); ``token_truncate``: by
    ``min(exp(old - sampler), mismatch_token_cap)`` (verl, Yao et al. 2025); ``sequence_mask``: by the sequence's
    ``exp(sum of old - sampler)``, or 0 outside [mismatch_sequence_min, mismatch_sequence_max] (TRL 1.16's default)."""
    mismatch_token_cap: float = 2.0
    """``token_truncate``: the largest token weight (verl's default threshold, 2.0)."""
    mismatch_sequence_min: float = 0.0
    """``sequence_mask``: a sequence whose ratio is below this is masked (0: no lower bound, TRL's default)."""
    mismatch_sequence_max: float = 3.0
    """``sequence_mask``: a sequence whose ratio is above this is masked (TRL's default, 3.0)."""

    def __post_init__(self) -> None:
        check_float("GRPOLoss.clip_low", self.clip_low, 0.0, 1.0, high_open=True)
        check_float("GRPOLoss.clip_high", self.clip_high, 0.0)
        if self.dual_clip is not None:
            check_float("GRPOLoss.dual_clip", self.dual_clip, 1.0, low_open=True)
        check_float("GRPOLoss.kl_coef", self.kl_coef, 0.0)
        check_float("GRPOLoss.entropy_coef", self.entropy_coef, 0.0)
        check_choice("GRPOLoss.aggregation", self.aggregation, AGGREGATIONS)
        check_choice("GRPOLoss.mismatch_correction", self.mismatch_correction, (None, *CORRECTIONS))
        check_float("GRPOLoss.mismatch_token_cap", self.mismatch_token_cap, 1.0)
        check_float("GRPOLoss.mismatch_sequence_min", self.mismatch_sequence_min, 0.0, 1.0, high_open=True)
        check_float("GRPOLoss.mismatch_sequence_max", self.mismatch_sequence_max, 1.0, low_open=True)

    def correct(self, old: Tensor, seqs: Sequences) -> tuple[Tensor | None, tuple[Tensor, Tensor]]:
        """The weights of ``seqs``'s per-token loss (``None``: unweighted) and their :func:`mismatch_sums`."""
        delta = old.detach().float() - seqs.sampler_logprobs  # [n, L]
        weights, hit = correction_weights(self.mismatch_correction, delta, seqs.response_mask,
                                          self.mismatch_token_cap, self.mismatch_sequence_min,
                                          self.mismatch_sequence_max)
        return weights, mismatch_sums(delta, seqs.response_mask, weights, hit)
