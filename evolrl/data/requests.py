"""A batch of the data module's loaders: prompts whose responses are sampled only when asked.

Lightning fetches batch t+1 before it runs training step t; a batch that sampled on fetch would train step t+1 on
the weights before step t. A :class:`RolloutRequest` holds the prompts, tokenized, and samples when the training
step asks the data module for its rollouts (``RolloutDataModule.next_rollouts``), or an evaluation step grades it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evolrl.data.eval_set import EvalSet
from evolrl.types import Prompt, RolloutBatch


@dataclass(frozen=True)
class RolloutRequest:
    """A batch of prompts whose responses are sampled only when asked (see module docstring)."""

    prompts: tuple[Prompt, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    sampler: Callable[[Sequence[Prompt], Sequence[Sequence[int]]], RolloutBatch]
    eval_set: EvalSet | None = None
    """The evaluation set of a validation/test batch (its name and grader); ``None`` for training."""
    max_rounds: int = 1
    """Sampling rounds the step may take (dynamic sampling); 1: this batch only."""
    further: Callable[[int], RolloutRequest] | None = None
    """The next prompts' request, sampled for a given round (dynamic sampling)."""

    def sample(self) -> RolloutBatch:
        """Generate the response groups now, with the engine's current weights."""
        return self.sampler(self.prompts, self.prompt_ids)

    def more(self, round: int) -> RolloutRequest:
        """The request of the step's further prompts, sampled with ``round``'s seeds (dynamic sampling)."""
        if self.further is None:
            raise RuntimeError("this batch has no further prompts: dynamic sampling is off (data.dynamic_sampling)")
        return self.further(round)

    def to(self, *args, **kwargs) -> RolloutRequest:
        """Itself: nothing to move to a device (see :meth:`evolrl.types.RolloutBatch.to`)."""
        return self
