"""Which rows of a training step go into which micro-batch (forward/backward pass).

A plan is ``[mini-batch][micro-batch] -> row indices``. Mini-batches are always consecutive runs of
``mini_batch_size`` rows (one optimizer step each, loss normalizer fixed per mini-batch), so how the rows of a
mini-batch are split into micro-batches never changes the math, only the memory and time a pass takes.

* By count: consecutive runs of ``micro_batch_size`` rows (:func:`micro_batch_plan`).
* By a token budget (:func:`token_budget_plan`): first-fit decreasing bin packing of the mini-batch's rows by
  length, so no pass computes on more than ``budget`` tokens (a longer row goes alone). A pass's tokens are
  what its forward computes on: the sum of the lengths when packed into one row, rows x longest when padded.
* Across ranks (:func:`lockstep`): under FSDP every pass all-gathers each block's weights, so every rank must
  run the same number of passes per mini-batch; ranks with fewer micro-batches get empty ones (``[]``), which
  the update runs as a filler that contributes exactly nothing (``Sequences.filler``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from evolrl.distributed import world_size

Plan = list[list[list[int]]]
"""``plan[mini-batch][micro-batch]``: row indices, ascending; ``[]`` is a filler pass (lockstep padding)."""


def mini_batch_ranges(n: int, mini_batch_size: int) -> list[range]:
    """The rows of each mini-batch: consecutive runs of ``mini_batch_size`` (the last may be shorter)."""
    return [range(start, min(start + mini_batch_size, n)) for start in range(0, n, mini_batch_size)]


def micro_batch_plan(n: int, mini_batch_size: int, micro_batch_size: int) -> Plan:
    """Consecutive runs of ``micro_batch_size`` rows within each mini-batch."""
    return [[list(mini[i : i + micro_batch_size]) for i in range(0, len(mini), micro_batch_size)]
            for mini in mini_batch_ranges(n, mini_batch_size)]


def pass_tokens(lengths: list[int], packed: bool) -> int:
    """Tokens a forward pass over sequences of ``lengths`` computes on: packed into one row, or right-padded."""
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def token_budget_plan(lengths: list[int], mini_batch_size: int, budget: int, packed: bool) -> Plan:
    """Within each mini-batch, rows binned so that no pass exceeds ``budget`` tokens (:func:`pass_tokens`).

    First-fit decreasing: rows by length, longest first (ties by index), each into the first micro-batch it fits,
    else a new one; a row longer than the budget goes alone. Micro-batches in the order they were opened (the
    longest first), rows ascending within each.
    """
    plan = []
    for mini in mini_batch_ranges(len(lengths), mini_batch_size):
        bins: list[list[int]] = []
        for row in sorted(mini, key=lambda r: (-lengths[r], r)):
            fits = (b for b in bins if pass_tokens([lengths[r] for r in b] + [lengths[row]], packed) <= budget)
            target = next(fits, None)
            if target is None:
                bins.append([row])
            else:
                target.append(row)
        plan.append([sorted(b) for b in bins])
    return plan


def lockstep(plan: Plan, device: torch.device) -> Plan:
    """``plan`` with every mini-batch padded by empty micro-batches to the most any rank has (one all-reduce).

    Every rank has the same number of mini-batches (the same rows per step), only their splits differ.
    """
    if world_size() == 1:
        return plan
    counts = torch.tensor([len(mini) for mini in plan], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    return [mini + [[] for _ in range(most - len(mini))] for mini, most in zip(plan, counts.tolist())]
