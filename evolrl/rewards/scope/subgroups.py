"""SCOPE's subgroups: the labels of one subgroup size, and the Pareto choice of that size.

For a subgroup size ``m`` the ``V`` responses of a prompt fall into ``V / m`` consecutive subgroups; each subgroup's
label is the confidence-weighted vote (``argmax_a sum_{i: a_i = a} C_i``) over ``votes`` responses drawn without
replacement from the prompt's V (its local consensus by repeat sampling), and a response scores 1 when its answer is
its subgroup's label. Over the sizes that divide V (1, 2, 4, ... and V itself) two numbers are measured on the whole
batch: ``q``, the mean reward, and ``e``, the mean number of distinct labels a prompt gets. The size kept is on the
Pareto front of ``(q, e)`` and nearest ``(1, 1)`` once both are min-max scaled over the front, with distance
``sqrt(lam (1 - q)^2 + (1 - lam)(1 - e)^2)``; ties go to the smaller size, as in the authors' search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Partition:
    """One subgroup size's labels over a batch."""

    size: int
    labels: list[list[int | None]]
    """``[P][V]``: the label class of each response's subgroup (``None``: no valid answer among its draws)."""
    rewards: torch.Tensor
    """``[P, V]``: 1 where a response's class is its subgroup's label."""

    @property
    def quality(self) -> float:
        """``q``: the mean reward."""
        return self.rewards.mean().item()

    @property
    def diversity(self) -> float:
        """``e``: distinct labels per prompt, a missing label counted as one."""
        return sum(len(set(row)) for row in self.labels) / len(self.labels)


def sizes(group: int) -> list[int]:
    """The subgroup sizes tried for a group of ``group`` responses: the powers of two that divide it, and itself."""
    out = [2 ** k for k in range(group.bit_length()) if group % 2 ** k == 0]
    return out if out[-1] == group else [*out, group]


def weighted_vote(classes: Sequence[int | None], weights: Sequence[float]) -> int | None:
    """The class with the largest sum of weights (ties to the one drawn first); ``None`` without a valid answer."""
    score: dict[int, float] = {}
    for c, w in zip(classes, weights):
        if c is not None:
            score[c] = score.get(c, 0.0) + w
    return max(score, key=score.get) if score else None  # max keeps the first of equal scores


def partition(classes: Sequence[Sequence[int | None]], weights: torch.Tensor, size: int, votes: int,
              generator: torch.Generator) -> Partition:
    """Labels and rewards of subgroup size ``size`` (``classes`` ``[P][V]``, ``weights`` ``[P, V]``)."""
    labels, group = [], len(classes[0])
    for row, w in zip(classes, weights.tolist()):
        mine = []
        for _ in range(group // size):
            drawn = torch.randperm(group, generator=generator)[:votes].tolist()
            mine += [weighted_vote([row[i] for i in drawn], [w[i] for i in drawn])] * size
        labels.append(mine)
    rewards = torch.tensor([[float(c is not None and c == lab) for c, lab in zip(row, mine)]
                            for row, mine in zip(classes, labels)])
    return Partition(size, labels, rewards)


def pareto_choice(candidates: Sequence[Partition], lam: float) -> Partition:
    """The candidate on the Pareto front of ``(q, e)`` nearest ``(1, 1)`` after min-max scaling (module docstring)."""
    points = [(c.quality, c.diversity) for c in candidates]

    def dominated(a: tuple[float, float]) -> bool:
        return any(b[0] >= a[0] and b[1] >= a[1] and b != a for b in points)

    front = [c for c, p in zip(candidates, points) if not dominated(p)]
    qs, es = [c.quality for c in front], [c.diversity for c in front]

    def distance(c: Partition) -> float:
        q = (c.quality - min(qs)) / (max(qs) - min(qs) + 1e-8)
        e = (c.diversity - min(es)) / (max(es) - min(es) + 1e-8)
        return math.sqrt(lam * (1 - q) ** 2 + (1 - lam) * (1 - e) ** 2)

    return min(front, key=distance)  # min keeps the first (smallest size) of equal distances
