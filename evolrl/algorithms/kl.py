"""KL penalty against the frozen reference policy."""

from __future__ import annotations

import torch
from torch import Tensor


def low_var_kl(logp: Tensor, ref_logp: Tensor, bound: float = 10.0) -> Tensor:
    """Per-token ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's k3), clamped to ``[-bound, bound]``.

    Unbiased for KL(pi || ref) under samples from pi and never negative; the clamp keeps
    one badly off-policy token from dominating a step.
    """
    delta = ref_logp - logp
    return (torch.exp(delta) - delta - 1.0).clamp(-bound, bound)
