"""The sampler/trainer mismatch: how far the engine's log-probs are from the trainer's, and importance weights.

Per response token t, ``delta_t = old_logp_t - sampler_logp_t``: the trainer's log-prob of the sampled token before the
update minus the one the engine reported when it sampled it, both of ``softmax(logits / temperature)``. The responses
were drawn from the sampler, not from the policy the loss assumes, so ``exp(delta_t)`` is the importance ratio
trainer / sampler of that token. With ``top_p < 1`` or ``top_k`` the engine's log-probs are renormalized over the
tokens it kept, so ``delta`` also counts that truncation, which is part of what the responses were drawn from.

Two corrections, each a weight on the per-token policy-gradient loss (never on the KL or the entropy term, as in
both sources), detached, with the loss normalizer unchanged (a masked token still counts in it, weighted 0):

* :func:`truncated_token_weights`, token-level truncated importance sampling (Yao et al. 2025, "Your Efficient RL
  Framework Secretly Brings You Off-Policy RL Training"; verl's ``rollout_is: token``, decoupled mode, default
  threshold 2.0): ``w_t = min(exp(delta_t), cap)``. Where ours differs from verl: no safety clamp of ``delta`` to
  +-20 before ``exp`` (the cap bounds the weight from above, and a weight that underflows to 0 is the right limit) and
  no option to renormalize the weights to mean 1 over the batch.
* :func:`masked_sequence_weights`, TRL 1.16's ``vllm_importance_sampling_mode="sequence_mask"`` (its default, with
  ``vllm_importance_sampling_clip_max=3.0`` and no lower bound): one ratio per sequence, the product of its token
  ratios ``rho = exp(sum_t delta_t)``; the sequence's weight is ``rho`` when ``low <= rho <= high`` and 0 otherwise,
  on every one of its tokens. Where ours differs from TRL: ``low`` is a number (0, TRL's ``None``, is the default),
  and no token's ``delta`` is NaN (TRL zeroes NaN log-probs from vLLM; evolrl's engines report every token).

:func:`mismatch_sums` and :func:`mismatch_summary` are the per-step diagnostics: mean and largest ``|delta|``, the k3
estimate of KL(sampler || trainer) (Schulman's ``exp(delta) - 1 - delta``, unbiased under the sampler's samples and
never negative), the largest token ratio and, with a correction, the share of tokens truncated or sequences masked.
Sums, not means, so that micro-batches and ranks add up before the one division.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CORRECTIONS = ("token_truncate", "sequence_mask")
"""The corrections; ``None`` is none."""

SUMS = ("gap", "kl", "tokens", "sequences", "weight", "hit_tokens", "hit_sequences")
"""What :func:`mismatch_sums` adds up, in this order."""
MAXIMA = ("delta", "gap")
"""What :func:`mismatch_sums` takes the largest of: ``delta`` and ``|delta|``."""


def truncated_token_weights(delta: Tensor, mask: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """``(weights [N, L], truncated [N, L])``: ``min(exp(delta), cap)`` and where the cap bit, at ``mask``'s tokens.

    Outside ``mask`` the weight is 1 and nothing is truncated (those positions are not in the loss).
    """
    ratio = torch.where(mask, delta, 0.0).exp()
    return ratio.clamp(max=cap), mask & (ratio > cap)


def masked_sequence_weights(delta: Tensor, mask: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """``(weights [N, 1], masked [N])``: each sequence's ``rho = exp(sum of delta over mask)``, or 0 where ``rho`` is
    outside ``[low, high]``.

    A sequence without tokens in ``mask`` has ``rho = 1``: kept (and it contributes nothing anyway).
    """
    rho = torch.where(mask, delta, 0.0).sum(-1).exp()  # [N]; an overflow to inf is above any bound: masked
    masked = (rho < low) | (rho > high)
    return torch.where(masked, 0.0, rho)[:, None], masked


def correction_weights(correction: str | None, delta: Tensor, mask: Tensor, token_cap: float = 2.0,
                       sequence_min: float = 0.0, sequence_max: float = 3.0) -> tuple[Tensor | None, Tensor]:
    """``(weights, hit)`` of ``correction`` (one of :data:`CORRECTIONS`, or ``None``); weights broadcast to ``[N, L]``
    (``None`` without a correction); ``hit`` ``[N, L]`` marks the tokens truncated (token level) or in a masked
    sequence."""
    if correction is None:
        return None, torch.zeros_like(mask)
    if correction == "token_truncate":
        return truncated_token_weights(delta, mask, token_cap)
    if correction == "sequence_mask":
        weights, masked = masked_sequence_weights(delta, mask, sequence_min, sequence_max)
        return weights, mask & masked[:, None]
    raise ValueError(f"unknown mismatch correction {correction!r}; choose one of {', '.join(CORRECTIONS)}")


def mismatch_sums(delta: Tensor, mask: Tensor, weights: Tensor | None, hit: Tensor) -> tuple[Tensor, Tensor]:
    """``(sums [len(SUMS)], maxima [len(MAXIMA)])`` over the response tokens in ``mask`` of one micro-batch.

    ``weights`` and ``hit`` are :func:`correction_weights`'s. Sequences count only when they have a response token (a
    filler pass adds nothing); a sequence is hit when all its response tokens were. Float64: ``exp(delta)`` of a
    stale engine can overflow float32.
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


def mismatch_summary(sums: Tensor, maxima: Tensor, correction: str | None) -> dict[str, float]:
    """The per-step diagnostics from :func:`mismatch_sums` added up (over micro-batches and ranks); empty without
    response tokens.

    Always: ``gap_mean``, ``gap_max`` (``|delta|``), ``kl`` (k3 of KL(sampler || trainer), mean per token),
    ``ratio_max`` (``exp`` of the largest ``delta``). With a correction: ``weight_mean`` (per response token) and
    ``truncated_token_frac`` (``token_truncate``) or ``masked_seq_frac`` and ``masked_token_frac``
    (``sequence_mask``).
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
    if correction == "token_truncate":
        out["truncated_token_frac"] = s["hit_tokens"] / tokens
    elif correction == "sequence_mask":
        out["masked_seq_frac"] = s["hit_sequences"] / s["sequences"]
        out["masked_token_frac"] = s["hit_tokens"] / tokens
    return out
