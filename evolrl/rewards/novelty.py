"""EVOL-RL's novelty (u) and reward bands, batched over prompts (docs/method.md, section 2).

For prompt p with valid responses V', L2-normalized embeddings e and
``S = clip(e e^T, 0, 1)`` (self excluded):

* ``mean_i``: mean similarity to the others in i's own group (majority or
  minority), or to all other valid responses when i is alone in its group;
* ``max_i``: max similarity to any other valid response of the prompt;
* ``u_i = 1 - (alpha * mean_i + (1 - alpha) * max_i)``.

``u`` is min-max normalized inside each group to ``z`` in [0, 1] (a group of one
gets ``z = 1``; a group whose ``u`` are equal up to float noise gets ``z = 0.5``),
then mapped to non-overlapping bands: majority ``0.5 + 0.5 z``, minority
``-1 + 0.5 z``, invalid ``-1``. Novelty never crosses prompts.

Min-max scaling stretches any spread of ``u`` over the whole band, a cosine gap of
0.01 as much as one of 0.5. ``min_spread`` (beyond the paper, off by default) keeps a
small spread small: below it a group's ``z`` is ``0.5 + (u - mid) / min_spread``,
centred on its middle ``mid = (min u + max u) / 2``, so ``z`` spans
``spread / min_spread`` of the band, meeting the equal group's 0.5 at no spread and
min-max at ``spread = min_spread``.

Deliberate differences from the authors' code: a prompt with a single valid
response treats it as a group of one (they scored every response -1), and S is
symmetrized so that two mutually most-similar responses get identical novelty.
"""

from __future__ import annotations

import torch
from torch import Tensor

EQUAL_ATOL = 1e-6
"""Novelty spreads below this count as "all equal" (matmul noise is ~1e-7 in float32)."""


def novelty_values(embeddings: Tensor, is_majority: Tensor, is_valid: Tensor, alpha: float = 0.5) -> Tensor:
    """Raw novelty ``u`` per response, ``[P, V]``; NaN for invalid responses and lone valid ones.

    Args:
        embeddings: ``[P, V, D]`` L2-normalized (rows of invalid responses are ignored).
        is_majority: ``[P, V]`` bool, the response agrees with its prompt's majority label.
        is_valid: ``[P, V]`` bool.
        alpha: weight of the intra-group mean against the max.
    """
    valid = is_valid.bool()
    majority = is_majority.bool() & valid
    e = embeddings.to(torch.promote_types(embeddings.dtype, torch.float32))  # float64 stays float64
    sim = (e @ e.transpose(1, 2)).clamp(0.0, 1.0)  # [P, V, V]
    sim = 0.5 * (sim + sim.transpose(1, 2))
    v = valid.shape[-1]
    not_self = ~torch.eye(v, dtype=torch.bool, device=valid.device)
    others = valid[:, :, None] & valid[:, None, :] & not_self  # [P, V, V]
    peers = others & (majority[:, :, None] == majority[:, None, :])  # same group
    n_peers = peers.sum(-1)
    peers = torch.where((n_peers > 0)[..., None], peers, others)  # alone in group: all others
    mean = (sim * peers).sum(-1) / peers.sum(-1).clamp(min=1)
    most = sim.masked_fill(~others, float("-inf")).amax(-1)
    u = 1.0 - (alpha * mean + (1.0 - alpha) * most)
    has_other = others.any(-1)
    return torch.where(has_other, u, torch.full_like(u, float("nan")))


def _group_range(novelty: Tensor, valid: Tensor, majority: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``u`` (NaN as 0) and, for each response's own group (majority or minority of the valid ones), the lowest and
    highest ``u`` and its size; each ``[P, V]``."""
    members = torch.stack([valid & ~majority, majority], dim=1)  # [P, 2 groups, V]
    u = novelty.nan_to_num(0.0)[:, None, :]
    lo = u.masked_fill(~members, float("inf")).amin(-1)  # [P, 2]
    hi = u.masked_fill(~members, float("-inf")).amax(-1)
    size = members.sum(-1)
    group = majority.long()  # 0 minority, 1 majority
    lo, hi, size = (t.gather(1, group) for t in (lo, hi, size))  # each response's own group, [P, V]
    return u[:, 0, :], lo, hi, size


def novelty_spread(novelty: Tensor, is_majority: Tensor, is_valid: Tensor) -> Tensor:
    """``[P, V]``: the raw spread ``max u - min u`` of each response's group before min-max scaling; NaN for invalid
    responses and groups of one."""
    valid = is_valid.bool()
    _, lo, hi, size = _group_range(novelty, valid, is_majority.bool() & valid)
    return torch.where(valid & (size > 1), hi - lo, torch.full_like(lo, float("nan")))


def band_rewards(novelty: Tensor, is_majority: Tensor, is_valid: Tensor, min_spread: float | None = None) -> Tensor:
    """Map raw novelty ``[P, V]`` to the banded rewards ``[P, V]``; ``min_spread``: the floor of the scale (module
    docstring; ``None``: the paper's min-max)."""
    valid = is_valid.bool()
    majority = is_majority.bool() & valid
    u, lo, hi, size = _group_range(novelty, valid, majority)
    spread = (hi - lo).nan_to_num(0.0, posinf=0.0, neginf=0.0)
    z = ((u - lo) / spread.clamp(min=EQUAL_ATOL)).clamp(0.0, 1.0)
    if min_spread is not None:
        mid = ((lo + hi) / 2).nan_to_num(0.0, posinf=0.0, neginf=0.0)
        z = torch.where(spread < min_spread, (0.5 + (u - mid) / min_spread).clamp(0.0, 1.0), z)
    z = torch.where(spread <= EQUAL_ATOL, torch.full_like(z, 0.5), z)
    z = torch.where(size == 1, torch.ones_like(z), z)
    reward = torch.where(majority, 0.5 + 0.5 * z, -1.0 + 0.5 * z)
    return torch.where(valid, reward, torch.full_like(reward, -1.0))
