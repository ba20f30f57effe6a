"""Consensus gating: when a group's majority may teach at all (CuMa, SCRL), an option of every majority-vote reward.

A group whose majority answer holds too small a share of its V responses (or leads the runner-up by too little) is
*gated*. Its majority is then no label: either the group trains on nothing (``mask``, CuMa: its responses leave the
loss, so neither the surrogate, the entropy bonus nor the KL term sees them) or on SCRL's negative-only signal
(``negative``): -1 for a rare answer the policy was unsure of, -1 for no answer, 0 otherwise. Groups that pass keep
the reward's own scores. Shares count every one of the V responses, those without an answer too (SCRL's
denominator), so a group of mostly unreadable responses has no consensus. A share equal to ``min_share`` passes; a
lead equal to ``min_margin`` does not, as SCRL's positive label needs ``margin > tau_marg`` (its ``scrl_utils.py``):
[3,3,3,3,5,5,5,none] leads by 0.125 and has no label at a margin of 0.125.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from evolrl.rewards.voting import class_counts
from evolrl.settings import check_choice, check_float, require

MODES = ("mask", "negative")

COMPONENTS = MappingProxyType({
    "gated": "bool: its group's majority lacks consensus (model.reward.gate), so it is no label",
    "left_out": "bool: out of the loss (a gated group under gate.gated: mask)",
})


@dataclass(frozen=True)
class ConsensusGate:
    """When a group's majority may teach (``gate`` of a majority-vote reward); ``null`` there: always."""

    min_share: float = 0.5
    """A group is gated when its majority answer holds less than this share of its V responses; in (0, 1]."""
    min_margin: float = 0.0
    """... or leads the second answer by at most this share (SCRL's tau_marg, strict; 0: no margin); in [0, 1]."""
    gated: str = "mask"
    """What a gated group trains on: ``mask``, nothing (CuMa); ``negative``, SCRL's negative-only rewards."""
    negative_share: float = 0.25
    """``negative``: an answer below this share scores -1 (SCRL's tau_neg, tuned there for 32 votes); in (0, 1]."""
    entropy_gate: bool = True
    """``negative``: and only if its responses' mean token entropy is at least the group's (SCRL; reads the policy)."""

    def __post_init__(self) -> None:
        for key, low_open in (("min_share", True), ("negative_share", True), ("min_margin", False)):
            value = getattr(self, key)
            check_float(f"ConsensusGate.{key}", value, 0.0, 1.0, low_open=low_open)
        check_choice("ConsensusGate.gated", self.gated, MODES)
        require(isinstance(self.entropy_gate, bool), "ConsensusGate.entropy_gate", self.entropy_gate,
                allowed="true or false")

    @property
    def reads_policy(self) -> bool:
        """Whether it needs the policy's token entropy (``negative`` with the entropy gate)."""
        return self.gated == "negative" and self.entropy_gate

    def closed(self, answer_class: Tensor) -> Tensor:
        """``[P]`` bool: the groups without consensus, from ``[P, V]`` answer classes (-1: no answer)."""
        top, lead = _top_share_and_lead(answer_class)
        closed = top < self.min_share
        if self.min_margin > 0:  # 0 is no margin: a tie is not gated by it
            closed |= lead <= self.min_margin
        return closed

    def __call__(self, rewards: Tensor, answer_class: Tensor, entropy: Tensor | None = None
                 ) -> tuple[Tensor, dict[str, Tensor]]:
        """The rewards with the gated groups' replaced (``negative``) and the components: ``gated`` and, under
        ``mask``, ``left_out``. ``entropy``: ``[P, V]`` mean token entropy per response, NaN where unknown (a
        response not trained on); needed under ``negative`` with the entropy gate."""
        gated = self.closed(answer_class)[:, None].expand_as(answer_class)
        if self.gated == "mask":
            return rewards, {"gated": gated, "left_out": gated}
        if self.entropy_gate and entropy is None:
            raise ValueError("ConsensusGate(gated: negative, entropy_gate: true) needs the responses' token entropy")
        negative = self.negatives(answer_class, entropy if self.entropy_gate else None)
        return torch.where(gated, -negative.float(), rewards.float()), {"gated": gated}

    def negatives(self, answer_class: Tensor, entropy: Tensor | None) -> Tensor:
        """``[P, V]`` bool: the responses SCRL scores -1 in a group without a label: no answer, or an answer whose
        share is below ``negative_share`` and (with ``entropy``) whose members' mean entropy is at least the group's
        (over the responses whose entropy is known; an answer with none known is not negative)."""
        out = answer_class < 0
        for p, row in enumerate(answer_class.tolist()):
            mean = _nanmean(entropy[p]) if entropy is not None else math.nan
            for c in set(row) - {-1}:
                members = answer_class[p] == c
                if members.sum().item() / len(row) >= self.negative_share:
                    continue
                if entropy is None or _nanmean(entropy[p][members]) >= mean:
                    out[p] |= members
        return out


def _top_share_and_lead(answer_class: Tensor) -> tuple[Tensor, Tensor]:
    """``[P]`` float64: the largest answer class's share of all V responses, and its lead over the second largest.
    Each is one division of counts, the nearest double to the exact ratio, so a lead equal to a margin written as
    a decimal (4 - 3 votes of 10 against 0.1) compares equal, not a rounding above or below it."""
    tops, leads = [], []
    for row in answer_class.tolist():
        counts = sorted(class_counts(row).values(), reverse=True) + [0, 0]
        tops.append(counts[0] / len(row))
        leads.append((counts[0] - counts[1]) / len(row))
    return torch.tensor(tops, dtype=torch.float64), torch.tensor(leads, dtype=torch.float64)


def _nanmean(values: Tensor) -> float:
    known = values[~values.isnan()]
    return known.mean().item() if known.numel() else math.nan
