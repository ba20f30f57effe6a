"""Reducing per-token losses to one number, independently of how the batch is split.

``token_mean``: sum over every response token of the mini-batch / number of those tokens.
``seq_mean_token_mean`` (the paper's equation 1): mean over sequences of each sequence's token mean.

Gradient accumulation must not change the math, so the normalizer is the
*mini-batch's* token (or sequence) count, fixed before the micro-batch loop and
passed to every micro-batch: the micro-batch losses then sum to the mini-batch loss.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("token_mean", "seq_mean_token_mean")


def normalizer_count(mask: Tensor, mode: str = "token_mean") -> Tensor:
    """What ``mode`` divides by, counted in ``mask [N, L]``: its response tokens, or its sequences."""
    if mode == "token_mean":
        return mask.sum()
    if mode == "seq_mean_token_mean":
        return torch.tensor(mask.shape[0], device=mask.device)
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")


def aggregate(values: Tensor, mask: Tensor, mode: str = "token_mean", normalizer: float | None = None) -> Tensor:
    """Masked reduction of ``values [N, L]`` over the response tokens in ``mask [N, L]``.

    Args:
        mode: ``token_mean`` or ``seq_mean_token_mean``.
        normalizer: Token count (``token_mean``) or sequence count (``seq_mean_token_mean``) of the
            whole mini-batch; defaults to this batch's own.
    """
    mask = mask.to(values.dtype)
    if mode == "token_mean":
        total = (values * mask).sum()
        return total / (normalizer if normalizer is not None else mask.sum().clamp(min=1))
    if mode == "seq_mean_token_mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / (normalizer if normalizer is not None else values.shape[0])
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
