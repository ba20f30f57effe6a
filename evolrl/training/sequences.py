"""Turning response groups into padded token tensors for the policy update."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from evolrl.algorithms.logprobs import logprobs_and_entropy
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

    def slice(self, start: int, stop: int) -> Sequences:
        """Rows ``start:stop``, trimmed to their own longest sequence."""
        width = int(self.attention_mask[start:stop].sum(-1).max().item())
        return Sequences(
            self.input_ids[start:stop, :width],
            self.attention_mask[start:stop, :width],
            self.response_mask[start:stop, : width - 1],
            self.advantages[start:stop],
        )

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


def micro_batch_plan(n: int, mini_batch_size: int, micro_batch_size: int) -> list[list[tuple[int, int]]]:
    """Row ranges ``(start, stop)`` of each micro-batch, grouped by mini-batch (one optimizer step each)."""
    plan = []
    for mb_start in range(0, n, mini_batch_size):
        mb_stop = min(mb_start + mini_batch_size, n)
        plan.append([(start, min(start + micro_batch_size, mb_stop))
                     for start in range(mb_start, mb_stop, micro_batch_size)])
    return plan


def sequence_logprobs(model, seqs: Sequences, temperature: float, chunk_size: int) -> tuple[Tensor, Tensor]:
    """``(log-prob, entropy)`` of every next token, ``[N, T - 1]``, under ``softmax(logits / temperature)``.

    Only positions from the first response token on get logits (the LM head and the log-softmax over the
    vocabulary are the costly part of a small model's step); earlier positions are returned as 0.
    """
    width = seqs.input_ids.shape[1]
    first = int(seqs.response_mask.any(0).nonzero()[0]) if seqs.response_mask.any() else width - 1
    keep = {"logits_to_keep": width - first} if _takes_logits_to_keep(model) else {}
    logits = model(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask, use_cache=False, **keep).logits
    logits = logits[:, -(width - first) :] if not keep else logits  # models without logits_to_keep
    logp, entropy = logprobs_and_entropy(logits[:, :-1], seqs.input_ids[:, first + 1 :], temperature, chunk_size)
    return F.pad(logp, (first, 0)), F.pad(entropy, (first, 0))


def _takes_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters
