"""The GRPO loss: its settings and its computation, in one place.

:class:`GRPOLoss` is a plain dataclass, so the CLI expands its fields (``model.loss.kl_coef``) and checks each where
it is declared. Per pass it computes, from the per-token log-probs and entropies:

* the policy-gradient term, a surrogate chosen by ``class_path`` (``policy_loss``, default
  :class:`~evolrl.algorithms.ClippedSurrogate`), weighted per token by the mismatch correction when one is set;
* minus ``entropy_coef`` times the entropy bonus;
* plus ``kl_coef`` times the low-variance KL to the frozen reference;

each aggregated with the mini-batch's normalizer (fixed before the micro-batch loop, so accumulation does not change
the math). The update (``update.py``) runs the passes and the optimizer; it owns no part of the formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache, partial

import torch
from torch import Tensor

from evolrl.algorithms import (
    Aggregation,
    ClippedSurrogate,
    MismatchCorrection,
    PolicyLoss,
    TokenMean,
    low_var_kl,
    mismatch_sums,
)
from evolrl.logprobs import Sequences
from evolrl.settings import check_float, require


@dataclass
class GRPOLoss:
    """Policy-loss settings (EVOL-RL defaults; TTRL uses ``clip_high=0.2, entropy_coef=0``)."""

    policy_loss: PolicyLoss = field(default_factory=ClippedSurrogate)
    """The policy-gradient surrogate (``class_path``); default ``evolrl.algorithms.ClippedSurrogate``."""
    kl_coef: float = 0.001
    """Weight of the low-variance KL to the initial policy; 0 drops the reference model."""
    entropy_coef: float = 0.003
    """Weight of the entropy bonus (EVOL-RL 0.003; TTRL 0)."""
    aggregation: Aggregation = field(default_factory=TokenMean)
    """How per-token losses become one number (``class_path``): ``evolrl.algorithms.TokenMean`` (default) or
    ``evolrl.algorithms.SeqMeanTokenMean``, the paper's per-sequence mean."""
    mismatch_correction: MismatchCorrection | None = None
    """Importance weights for the sampler/trainer gap (``class_path``: ``evolrl.algorithms.TokenTruncate`` or
    ``SequenceMask``; needs an engine that reports log-probs); ``null``: none, as in the paper's code."""

    def __post_init__(self) -> None:
        require(isinstance(self.policy_loss, PolicyLoss), "GRPOLoss.policy_loss", self.policy_loss,
                allowed="an evolrl.algorithms.PolicyLoss, e.g. evolrl.algorithms.ClippedSurrogate()")
        check_float("GRPOLoss.kl_coef", self.kl_coef, 0.0)
        check_float("GRPOLoss.entropy_coef", self.entropy_coef, 0.0)
        require(isinstance(self.aggregation, Aggregation), "GRPOLoss.aggregation", self.aggregation,
                allowed="an evolrl.algorithms.Aggregation, e.g. evolrl.algorithms.TokenMean()")
        require(self.mismatch_correction is None or isinstance(self.mismatch_correction, MismatchCorrection),
                "GRPOLoss.mismatch_correction", self.mismatch_correction,
                allowed="null or an evolrl.algorithms.MismatchCorrection, e.g. evolrl.algorithms.TokenTruncate()")

    def as_dict(self) -> dict:
        """The settings as plain values (a chosen class as its ``class_path`` and ``init_args``), as in a config."""
        return asdict(self) | {name: as_config(getattr(self, name))
                               for name in ("policy_loss", "aggregation", "mismatch_correction")}

    def correct(self, old: Tensor, seqs: Sequences) -> tuple[Tensor | None, tuple[Tensor, Tensor]]:
        """The mismatch weights of ``seqs``'s per-token loss (``None``: unweighted) and their :func:`mismatch_sums`."""
        delta = old.detach().float() - seqs.sampler_logprobs  # [n, L]
        if self.mismatch_correction is None:
            weights, hit = None, torch.zeros_like(seqs.response_mask)
        else:
            weights, hit = self.mismatch_correction.weights(delta, seqs.response_mask)
        return weights, mismatch_sums(delta, seqs.response_mask, weights=weights, hit=hit)

    def __call__(self, logp: Tensor, entropy: Tensor, old: Tensor, ref: Tensor | None, advantages: Tensor,
                 mask: Tensor, normalizer: Tensor, weights: Tensor | None,
                 compiled: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        """A pass's loss and its terms (:func:`pass_loss`); ``compiled``: through ``torch.compile``."""
        return _loss_of(compiled)(self, logp, entropy, old=old, ref=ref, advantages=advantages, mask=mask,
                                  normalizer=normalizer, weights=weights)


def as_config(choice: object | None) -> dict | None:
    """A chosen class (a frozen dataclass) as its ``class_path`` and ``init_args``, as in a config; ``None`` as is."""
    if choice is None:
        return None
    return {"class_path": f"{type(choice).__module__}.{type(choice).__qualname__}", "init_args": asdict(choice)}


def pass_loss(cfg: GRPOLoss, logp: Tensor, entropy: Tensor, old: Tensor, ref: Tensor | None, advantages: Tensor,
              mask: Tensor, normalizer: Tensor, weights: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """A pass's loss from its per-token log-probs and entropies ``[N, L]``, and its terms (detached, float32): the
    surrogate (times the mismatch ``weights``, if any), the entropy bonus, the KL to ``ref``, the clip fractions,
    each aggregated with the mini-batch's ``normalizer``. An entropy coefficient of 0 leaves the entropy out of the
    loss's graph (reported, not differentiated: the fused head then skips its gradient)."""
    pg, clips = cfg.policy_loss(logp, old, advantages, mask)
    if weights is not None:
        pg = pg * weights
    agg = partial(cfg.aggregation, mask=mask, normalizer=normalizer)
    terms = {"pg_loss": agg(pg), "entropy": agg(entropy if cfg.entropy_coef else entropy.detach())}
    loss = terms["pg_loss"] - cfg.entropy_coef * terms["entropy"] if cfg.entropy_coef else terms["pg_loss"]
    if ref is not None:
        terms["kl"] = agg(low_var_kl(logp, ref))
        loss = loss + cfg.kl_coef * terms["kl"]
    terms["loss"] = loss
    terms |= {f"{name}_frac": agg(flag.float()) for name, flag in clips.items()}
    return loss, {name: value.detach().float() for name, value in terms.items()}


@cache
def _loss_of(compiled: bool) -> Callable:
    """:func:`pass_loss`, or with ``compiled`` (``Batching.compile_blocks``) its ``torch.compile``d form (shapes
    dynamic): its two dozen elementwise operators and reductions, forward and backward, as a few fused kernels."""
    return torch.compile(pass_loss, dynamic=True) if compiled else pass_loss
