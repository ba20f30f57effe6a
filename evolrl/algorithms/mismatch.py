"""The sampler/trainer mismatch: how far the engine's log-probs are from the trainer's, measured per step.

Per response token t, ``delta_t = old_logp_t - sampler_logp_t``: the trainer's log-prob of the sampled token before the
update minus the one the engine reported when it sampled it, both of ``softmax(logits / temperature)``. The responses
were drawn from the sampler, not from the policy the loss assumes, so ``exp(delta_t)`` is the importance ratio
trainer / sampler of that token. With ``top_p < 1`` or ``top_k`` the engine's log-probs are renormalized over the
tokens it kept, so ``delta`` also counts that truncation, which is part of what the responses were drawn from.

The corrections that weigh the loss by these ratios are classes in ``evolrl/algorithms/corrections.py``.

:func:`mismatch_sums` and :func:`mismatch_summary` are the per-step diagnostics: mean and largest ``|delta|``, the k3
estimate of KL(sampler || trainer) (Schulman's ``exp(delta) - 1 - delta``, unbiased under the sampler's samples and
never negative), the largest token ratio and, with a correction, the share of tokens truncated or sequences masked.
Sums, not means, so that micro-batches and ranks add up before the one division.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from evolrl.algorithms.corrections import MismatchCorrection

SUMS = ("gap", "kl", "tokens", "sequences", "weight", "hit_tokens", "hit_sequences")
"""What :func:`mismatch_sums` adds up, in this order."""
MAXIMA = ("delta", "gap")
"""What :func:`mismatch_sums` takes the largest of: ``delta`` and ``|delta|``."""


def mismatch_sums(delta: Tensor, mask: Tensor, weights: Tensor | None, hit: Tensor) -> tuple[Tensor, Tensor]:
    """``(sums [len(SUMS)], maxima [len(MAXIMA)])`` over the response tokens in ``mask`` of one micro-batch.

    ``weights`` and ``hit`` are the correction's (:meth:`MismatchCorrection.weights`; ``None`` and nothing hit
    without one). Sequences count only when they have a response token (a filler pass adds nothing); a sequence is
    hit when all its response tokens were. Float64: ``exp(delta)`` of a stale engine can overflow float32.
    """
    d = delta.double()
    m = mask.double()
    has_tokens = mask.any(-1)
    w = weights.double().expand_as(d) if weights is not None else torch.ones_like(d)
    sums = torch.stack([
        (d.abs() * m).sum(),
        ((d.exp() - 1 - d) * m).sum(),
        m.sum(),
        has_tokens.double().sum(),
        (w * m).sum(),
        (hit & mask).double().sum(),
        (has_tokens & (hit | ~mask).all(-1)).double().sum(),
    ])
    lowest = torch.tensor(-math.inf, dtype=torch.float64, device=d.device)
    maxima = torch.stack([torch.where(mask, d, lowest).max(), torch.where(mask, d.abs(), lowest).max()])
    return sums, maxima


def mismatch_summary(sums: Tensor, maxima: Tensor, correction: MismatchCorrection | None) -> dict[str, float]:
    """The per-step diagnostics from :func:`mismatch_sums` added up (over micro-batches and ranks); empty without
    response tokens.

    Always: ``gap_mean``, ``gap_max`` (``|delta|``), ``kl`` (k3 of KL(sampler || trainer), mean per token),
    ``ratio_max`` (``exp`` of the largest ``delta``). With a correction: ``weight_mean`` (per response token) and its
    :meth:`~MismatchCorrection.hit_fractions`: ``truncated_token_frac`` (:class:`TokenTruncate`) or
    ``masked_seq_frac`` and ``masked_token_frac`` (:class:`SequenceMask`).
    """
    s = dict(zip(SUMS, sums.tolist()))
    top = dict(zip(MAXIMA, maxima.tolist()))
    if s["tokens"] == 0:
        return {}
    tokens = s["tokens"]
    out = {"gap_mean": s["gap"] / tokens, "gap_max": top["gap"], "kl": s["kl"] / tokens,
           "ratio_max": math.exp(min(top["delta"], 709.0))}  # exp(709) is the largest float64
    if correction is not None:
        out["weight_mean"] = s["weight"] / tokens
        out |= correction.hit_fractions(tokens=tokens, sequences=s["sequences"], hit_tokens=s["hit_tokens"],
                                        hit_sequences=s["hit_sequences"])
    return out
