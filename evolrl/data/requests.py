"""A batch of the data module's loaders: prompts whose responses are sampled only when asked.

Lightning fetches batch t+1 before it runs training step t; a batch that sampled on fetch would train step t+1 on
the weights before step t. A :class:`RolloutRequest` is plain data, the prompts tokenized: the training step hands it
to its sampler (``RolloutDataModule.next_rollouts``, or ``eval_rollouts`` for an evaluation batch), which samples it
then, with the weights of that moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evolrl.data.eval_set import EvalSet
from evolrl.types import Prompt


@dataclass(frozen=True)
class RolloutRequest:
    """A batch of prompts whose responses are sampled only when asked (see module docstring)."""

    prompts: tuple[Prompt, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    eval_set: EvalSet | None = None
    """The evaluation set of a validation/test batch (its name and grader); ``None`` for training."""
    max_rounds: int = 1
    """Sampling rounds the step may take (dynamic sampling): after this batch, ``max_rounds - 1`` further batches of
    the loader's next prompts at most."""

    @classmethod
    def of(cls, items: Sequence[tuple[Prompt, tuple[int, ...]]], eval_set: EvalSet | None = None,
           max_rounds: int = 1) -> RolloutRequest:
        """The request of ``items``, each a prompt and its token ids."""
        return cls(tuple(p for p, _ in items), tuple(ids for _, ids in items), eval_set, max_rounds)

    def to(self, *args, **kwargs) -> RolloutRequest:
        """Itself: nothing to move to a device (see :meth:`evolrl.types.RolloutBatch.to`)."""
        return self
