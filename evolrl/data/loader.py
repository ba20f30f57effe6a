"""A resumable loader of prompt batches.

Each pass shuffles the prompts with the epoch's seed (``Seeds.shuffle``); ``state_dict`` records the epoch and how
many batches were handed out, and Lightning stores it in every checkpoint, so a resumed run
continues with exactly the batches the interrupted one would have seen next (mid-epoch or at
an epoch boundary). No worker processes: a batch is only a request for rollouts.

Dynamic sampling draws further batches inside a step (:meth:`PromptLoader.take`): they move the same position on, so
a step's extra prompts are never seen again in that epoch, and the checkpoint after the step records them too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from evolrl.rollout.seeds import Seeds


class PromptLoader:
    """Batches of ``batch_size`` items, each turned into a request by ``make_batch``; last partial batch dropped.

    With ``world_size > 1`` every rank gets its own disjoint batches of the same shuffled order (so a
    prompt's whole group stays on one rank) and all ranks take the same number of steps.
    """

    def __init__(self, items: Sequence[Any], batch_size: int, make_batch: Callable[[list[Any]], Any],
                 shuffle: bool = True, seeds: Seeds | None = None, rank: int = 0, world_size: int = 1) -> None:
        self.items = items
        self.batch_size = batch_size
        self.make_batch = make_batch
        self.shuffle = shuffle
        self.seeds = seeds if seeds is not None else Seeds()
        self.rank = rank
        self.world_size = world_size
        self.epoch = -1  # epoch of the current (or last) pass
        self.position = 0  # batches handed out in that pass
        self._resuming = False  # the next pass continues the current one (a restored state, or take() began it)

    @staticmethod
    def batches(items: int, batch_size: int, world_size: int = 1) -> int:
        """Batches per pass (on every rank alike) for ``items`` prompts."""
        return items // (batch_size * world_size)

    def __len__(self) -> int:
        return self.batches(len(self.items), self.batch_size, self.world_size)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.items)))
        generator = torch.Generator().manual_seed(self.seeds.shuffle(self.epoch))
        return torch.randperm(len(self.items), generator=generator).tolist()

    def __iter__(self) -> Iterator[Any]:
        if not self._resuming or self.position >= len(self):
            self.epoch += 1
            self.position = 0
        self._resuming = False
        epoch, order = self.epoch, self._order()
        while self.epoch == epoch and self.position < len(self):  # take() may have begun the next epoch
            yield self._next(order)

    def take(self) -> Any:
        """The next batch, outside the iteration (dynamic sampling's further prompts); when the epoch is spent, the
        first of the next one, which the next iteration then continues."""
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
            self._resuming = True
        return self._next(self._order())

    def _next(self, order: list[int]) -> Any:
        start = (self.position * self.world_size + self.rank) * self.batch_size
        self.position += 1
        return self.make_batch([self.items[i] for i in order[start : start + self.batch_size]])

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._resuming = True
