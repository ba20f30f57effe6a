"""Turning response groups into padded token tensors for the policy update."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from evolrl.types import RolloutBatch


@dataclass(frozen=True)
class Layout:
    """Where a batch's tokens are, on the host: what a pass needs to cut, pack and score its rows without reading
    the device (each read would wait for it). Taken from the tensors while they are still on the host."""

    lengths: Tensor
    """``[N]`` tokens in each sequence (CPU)."""
    rows: Tensor
    cols: Tensor
    """``[K]`` each: the response positions (``response_mask``'s true entries, CPU) when the batch was built. A mask
    narrowed later (overlong masking) scores a subset of them: a pass computes these and the mask zeroes the rest."""
    prompts: Tensor
    """``[N]`` for each sequence, the first sequence of the batch with the same prompt (the tokens before its first
    response position): equal entries, one prompt (``shared_prompts.py`` computes it once)."""

    @staticmethod
    def of(input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor) -> Layout:
        rows, cols = response_mask.cpu().nonzero(as_tuple=True)
        return Layout(attention_mask.cpu().sum(-1), rows, cols, _first_with_same_prompt(input_ids.cpu(), rows, cols))

    def select(self, rows: list[int]) -> Layout:
        """The layout of the sequences ``rows``, in that order."""
        new = torch.full((len(self.lengths),), -1, dtype=torch.long)
        new[rows] = torch.arange(len(rows))
        order = new[self.rows]
        kept = order >= 0
        place = torch.sort(order[kept], stable=True).indices  # row by row, each row's columns in their order
        return Layout(self.lengths[rows], order[kept][place], self.cols[kept][place], self.prompts[rows])


def _first_with_same_prompt(input_ids: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``Layout.prompts`` of host ``input_ids`` whose response positions are ``(rows, cols)``; a sequence without
    any is its own."""
    first = torch.full((len(input_ids),), input_ids.shape[1], dtype=torch.long).scatter_reduce(0, rows, cols, "amin")
    seen: dict[tuple[int, ...], int] = {}
    return torch.tensor([seen.setdefault(tuple(ids[: end + 1].tolist()), i) if end < len(ids) else i
                         for i, (ids, end) in enumerate(zip(input_ids, first.tolist()))], dtype=torch.long)


def to_device(host: Tensor, device: torch.device) -> Tensor:
    """A host tensor on ``device``, copied without blocking from pinned memory on a GPU (a copy from pageable memory
    would wait for the device's queue)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


@dataclass(frozen=True)
class Sequences:
    """``N = P * G`` prompt+response sequences, right-padded, group-major.

    ``response_mask`` is aligned with the *targets* ``input_ids[:, 1:]``: it marks the
    positions whose next-token prediction is a response token; ``sampler_logprobs`` is aligned with it.
    """

    input_ids: Tensor  # [N, T]
    attention_mask: Tensor  # [N, T]
    response_mask: Tensor  # [N, T - 1]
    advantages: Tensor  # [N]
    sampler_logprobs: Tensor | None = None
    """``[N, T - 1]`` float32: the engine's log-prob of each response token when it sampled it (0 elsewhere);
    ``None`` when the engine reports none."""
    layout: Layout | None = field(default=None, compare=False)
    """Where the tokens are, on the host (:class:`Layout`): taken at construction while the tensors are on the
    host, and kept when they move."""
    old_logprobs: Tensor | None = None
    """``[N, T - 1]``: the policy's log-probs before the update, where a pass already computed them (one a reward
    read): the update's old log-probs, no pass of its own; ``None``: the update computes them."""
    max_new_tokens: int | None = None
    """The response budget the responses were sampled with (``RolloutBatch.max_new_tokens``): what a constant
    loss normalizer reads."""

    def __post_init__(self) -> None:
        if self.layout is None and self.attention_mask.device.type == "cpu":
            object.__setattr__(self, "layout", Layout.of(self.input_ids, self.attention_mask, self.response_mask))

    def host_layout(self) -> Layout:
        """:attr:`layout`; for sequences built on a device, read from it (waiting for it)."""
        return self.layout if self.layout is not None else Layout.of(self.input_ids, self.attention_mask,
                                                                      self.response_mask)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        """Tokens in each sequence, ``[N]``."""
        return self.attention_mask.sum(-1)

    def select(self, rows: list[int]) -> Sequences:
        """The sequences ``rows`` (in that order), trimmed to their own longest."""
        layout = self.host_layout().select(rows)
        index = to_device(torch.tensor(rows), self.input_ids.device)
        width = int(layout.lengths.max())
        sampler, old = (t[index, : width - 1] if t is not None else None for t in (self.sampler_logprobs,
                                                                                   self.old_logprobs))
        return Sequences(
            self.input_ids[index, :width],
            self.attention_mask[index, :width],
            response_mask=self.response_mask[index, : width - 1],
            advantages=self.advantages[index],
            sampler_logprobs=sampler,
            layout=layout,
            old_logprobs=old,
            max_new_tokens=self.max_new_tokens,
        )

    @staticmethod
    def filler(device: torch.device, sampler_logprobs: bool = False) -> Sequences:
        """A two-token sequence without response tokens: a forward/backward pass whose loss and gradient are
        exactly zero, run where another rank has one more micro-batch (``evolrl.training.plan.lockstep``); with
        (zero) sampler log-probs when the sequences it stands in for have them."""
        ones = torch.ones(1, 2, dtype=torch.long)
        nothing = torch.zeros(1, 1, dtype=torch.bool)
        return Sequences(ones * 0, ones, response_mask=nothing, advantages=torch.zeros(1),
                         sampler_logprobs=torch.zeros(1, 1) if sampler_logprobs else None).to(device)

    def to(self, device: torch.device) -> Sequences:
        tensors = (self.input_ids, self.attention_mask, self.response_mask, self.advantages, self.sampler_logprobs)
        moved = self.old_logprobs.to(device) if self.old_logprobs is not None else None
        return Sequences(*(t.to(device) if t is not None else None for t in tensors), layout=self.layout,
                         old_logprobs=moved, max_new_tokens=self.max_new_tokens)


def trained_sequences(rollouts: RolloutBatch, advantages: Tensor, pad_id: int) -> Sequences:
    """Sequences for the trained subset ``rollouts.trained`` ``[P, G]`` with per-response ``advantages [P, G]``, and
    the sampler's log-probs when every group has them."""
    if rollouts.trained is None:
        raise ValueError("the rollout batch has no trained subset")
    reported = [bool(group.sampler_logprobs) for group in rollouts.groups]
    if any(reported) and not all(reported):
        missing = next(g.prompt.id for g, r in zip(rollouts.groups, reported) if not r)
        raise ValueError(f"prompt {missing!r}: the rollout engine reported sampler log-probs for some groups only")
    rows, prompt_lengths, logprobs = [], [], []
    for group, picks in zip(rollouts.groups, rollouts.trained.tolist()):
        if not group.prompt_ids or not group.response_ids:
            raise ValueError(f"prompt {group.prompt.id!r}: the rollout engine returned no token ids")
        for v in picks:
            rows.append(list(group.prompt_ids) + list(group.response_ids[v]))
            prompt_lengths.append(len(group.prompt_ids))
            if group.sampler_logprobs:
                if len(group.sampler_logprobs[v]) != len(group.response_ids[v]):
                    raise ValueError(f"prompt {group.prompt.id!r}, response {v}: {len(group.sampler_logprobs[v])} "
                                     f"sampler log-probs for {len(group.response_ids[v])} tokens")
                logprobs.append(group.sampler_logprobs[v])
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    sampler = torch.zeros(len(rows), width - 1) if all(reported) else None
    for i, (row, start) in enumerate(zip(rows, prompt_lengths)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        response[i, start - 1 : len(row) - 1] = True  # logits at t predict token t + 1
        if sampler is not None:
            sampler[i, start - 1 : len(row) - 1] = torch.tensor(logprobs[i], dtype=torch.float32)
    return Sequences(input_ids, attention, response_mask=response, advantages=advantages.reshape(-1).float(),
                     sampler_logprobs=sampler, max_new_tokens=rollouts.max_new_tokens)
