"""Turning response groups into padded token tensors for the policy update."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evolrl.types import RolloutBatch


@dataclass(frozen=True)
class Sequences:
    """``N = P * G`` prompt+response sequences, right-padded, group-major.

    ``response_mask`` is aligned with the *targets* ``input_ids[:, 1:]``: it marks the
    positions whose next-token prediction is a response token.
    """

    input_ids: Tensor  # [N, T]
    attention_mask: Tensor  # [N, T]
    response_mask: Tensor  # [N, T - 1]
    advantages: Tensor  # [N]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        """Tokens in each sequence, ``[N]``."""
        return self.attention_mask.sum(-1)

    def select(self, rows: list[int]) -> Sequences:
        """The sequences ``rows`` (in that order), trimmed to their own longest."""
        index = torch.tensor(rows, device=self.input_ids.device)
        width = int(self.attention_mask[index].sum(-1).max().item())
        return Sequences(
            self.input_ids[index, :width],
            self.attention_mask[index, :width],
            self.response_mask[index, : width - 1],
            self.advantages[index],
        )

    @staticmethod
    def filler(device: torch.device) -> Sequences:
        """A two-token sequence without response tokens: a forward/backward pass whose loss and gradient are
        exactly zero, run where another rank has one more micro-batch (``evolrl.training.plan.lockstep``)."""
        ones = torch.ones(1, 2, dtype=torch.long, device=device)
        return Sequences(ones * 0, ones, torch.zeros(1, 1, dtype=torch.bool, device=device), torch.zeros(1, device=device))

    def to(self, device: torch.device) -> Sequences:
        return Sequences(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.response_mask,
                                                   self.advantages)))


def pack(rollouts: RolloutBatch, advantages: Tensor, pad_id: int) -> Sequences:
    """Sequences for the trained subset ``rollouts.trained`` ``[P, G]`` with per-response ``advantages [P, G]``."""
    if rollouts.trained is None:
        raise ValueError("the rollout batch has no trained subset")
    rows, prompt_lengths = [], []
    for group, picks in zip(rollouts.groups, rollouts.trained.tolist()):
        if not group.prompt_ids or not group.response_ids:
            raise ValueError(f"prompt {group.prompt.id!r}: the rollout engine returned no token ids")
        for v in picks:
            rows.append(list(group.prompt_ids) + list(group.response_ids[v]))
            prompt_lengths.append(len(group.prompt_ids))
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, (row, start) in enumerate(zip(rows, prompt_lengths)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        response[i, start - 1 : len(row) - 1] = True  # logits at t predict token t + 1
    return Sequences(input_ids, attention, response, advantages.reshape(-1).float())
