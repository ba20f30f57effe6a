"""The policy-loss settings: clipping, KL, entropy bonus, aggregation, advantage scaling, mismatch correction.

A plain dataclass, so the CLI expands its fields (``model.loss.clip_high``) and checks each where it is declared;
:class:`~evolrl.training.update.GRPOUpdate` reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from evolrl.algorithms import Aggregation, MismatchCorrection, TokenMean, mismatch_sums
from evolrl.settings import check_float, require
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
    aggregation: Aggregation = field(default_factory=TokenMean)
    """How per-token losses become one number (``class_path``): ``evolrl.algorithms.TokenMean`` over the mini-batch's
    response tokens (default), or ``evolrl.algorithms.SeqMeanTokenMean``, the paper's per-sequence mean."""
    scale_by_std: bool = True
    """Divide advantages by the group's std (GRPO); ``false`` is Dr. GRPO."""
    mismatch_correction: MismatchCorrection | None = None
    """Weigh each token's policy-gradient loss for the sampler/trainer gap (``class_path``; needs an engine that reports
    log-probs, e.g. vLLM; ``fit`` refuses others at start). ``null``: none (the paper's code);
    ``evolrl.algorithms.TokenTruncate``: by ``min(exp(old - sampler), cap)`` (verl, Yao et al. 2025);
    ``evolrl.algorithms.SequenceMask``: by the sequence's ``exp(sum of old - sampler)``, or 0 outside ``[low, high]``
    (TRL 1.16's default)."""

    def __post_init__(self) -> None:
        check_float("GRPOLoss.clip_low", self.clip_low, low=0.0, high=1.0, high_open=True)
        check_float("GRPOLoss.clip_high", self.clip_high, 0.0)
        if self.dual_clip is not None:
            check_float("GRPOLoss.dual_clip", self.dual_clip, 1.0, low_open=True)
        check_float("GRPOLoss.kl_coef", self.kl_coef, 0.0)
        check_float("GRPOLoss.entropy_coef", self.entropy_coef, 0.0)
        require(isinstance(self.aggregation, Aggregation), "GRPOLoss.aggregation", self.aggregation,
                allowed="an evolrl.algorithms.Aggregation, e.g. evolrl.algorithms.TokenMean()")
        require(self.mismatch_correction is None or isinstance(self.mismatch_correction, MismatchCorrection),
                "GRPOLoss.mismatch_correction", self.mismatch_correction,
                allowed="null or an evolrl.algorithms.MismatchCorrection, e.g. evolrl.algorithms.TokenTruncate()")

    def as_dict(self) -> dict:
        """The settings as plain values (a chosen class as its ``class_path`` and ``init_args``), as in a config."""
        def plain(choice: object | None) -> dict | None:
            if choice is None:
                return None
            return {"class_path": f"{type(choice).__module__}.{type(choice).__qualname__}", "init_args": asdict(choice)}

        return asdict(self) | {"aggregation": plain(self.aggregation),
                               "mismatch_correction": plain(self.mismatch_correction)}

    def correct(self, old: Tensor, seqs: Sequences) -> tuple[Tensor | None, tuple[Tensor, Tensor]]:
        """The weights of ``seqs``'s per-token loss (``None``: unweighted) and their :func:`mismatch_sums`."""
        delta = old.detach().float() - seqs.sampler_logprobs  # [n, L]
        if self.mismatch_correction is None:
            weights, hit = None, torch.zeros_like(seqs.response_mask)
        else:
            weights, hit = self.mismatch_correction.weights(delta, seqs.response_mask)
        return weights, mismatch_sums(delta, seqs.response_mask, weights=weights, hit=hit)
