"""The clipped policy-gradient surrogate with asymmetric and dual clipping (docs/method.md, section 1.6)."""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss ``[N, L]`` and boolean masks of where each clip was active.

    ``ratio = exp(logp - old_logp)``;
    ``L = max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` also
    ``L = min(L, -A dual_clip)`` (dual clip; ``None`` turns it off).

    Args:
        logp, old_logp: ``[N, L]`` log-probs of the sampled tokens under the current and the
            pre-update policy.
        advantages: ``[N, L]``, or ``[N, 1]`` to broadcast one advantage per sequence.

    Returns:
        ``(loss, masks)`` with masks ``clip_low`` (ratio below ``1 - clip_low`` with ``A < 0``),
        ``clip_high`` (ratio above ``1 + clip_high`` with ``A > 0``) and ``dual_clip``.
    """
    ratio = torch.exp(logp - old_logp)
    advantages = advantages.expand_as(ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    masks = {
        "clip_low": (ratio < 1.0 - clip_low) & (advantages < 0),
        "clip_high": (ratio > 1.0 + clip_high) & (advantages > 0),
    }
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip={dual_clip} must be greater than 1 (or None to turn it off)")
        bound = -advantages * dual_clip
        masks["dual_clip"] = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, masks
