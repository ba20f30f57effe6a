"""What evolrl's callbacks read from a step, and how they get it.

The callbacks never look inside a LightningModule. They read the *output* of a
training or validation step through an extractor function, configured in their
``__init__``: ``extract(outputs, batch) -> view`` (in the manner of Lightning's
``ThroughputMonitor(batch_size_fn=...)``). The defaults read evolrl's own step
outputs; another Lightning RL module plugs in by returning a view itself::

    def my_view(outputs, batch):
        return TrainView(rewards=outputs["reward_output"], entropy=outputs["entropy"],
                         response_lengths=outputs["lengths"])

    trainer = L.Trainer(callbacks=[LabelFreeDiagnostics(extract=my_view), PolicyStats(extract=my_view)])

A view is a small frozen dataclass; fields a module cannot supply stay ``None`` and the
metrics that need them are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import Tensor

from evolrl.settings import require
from evolrl.types import EvalOutput, RewardOutput, RolloutBatch, StepOutput


@dataclass(frozen=True)
class TrainView:
    """One training step, as the training-time callbacks see it."""

    rewards: RewardOutput | None = None
    """Rewards and their components, ``[P, V]`` (label-free diagnostics, samples)."""
    rollouts: RolloutBatch | None = None
    """The response groups (sample rows; truncation flags; ground truth when present)."""
    entropy: float | None = None
    """Token-mean policy entropy over response tokens."""
    response_lengths: Tensor | None = None
    """Tokens per response, any shape."""
    truncated: Tensor | None = None
    """Whether each response hit the token limit, same shape as ``response_lengths``."""
    step: int | None = None
    """Training steps behind the weights the responses were sampled with: the 0-based index of this training
    step, the x of the scalars Lightning logs from ``training_step``. ``None``: the trainer's ``global_step``."""

    def truths(self) -> list[str | None] | None:
        return [p.answer for p in self.rollouts.prompts] if self.rollouts is not None else None


@dataclass(frozen=True)
class EvalView:
    """One validation/test batch: ``n`` graded samples for each of its problems."""

    dataset: str
    answers: Sequence[Sequence[str | None]]
    """Extracted answers, ``[problems][n]``."""
    correct: Sequence[Sequence[bool]]
    """Whether each answer is right, ``[problems][n]``."""
    step: int | None = None
    """Training steps behind the evaluated weights (the x of the curves); ``None``: the trainer's global step."""
    ids: Sequence[str] | None = None
    """Problem ids, ``[problems]``: on several ranks a problem evaluated twice (the padding of Lightning's
    distributed sampler) then counts once."""
    rollouts: RolloutBatch | None = None
    """The sampled groups (questions, response texts and token ids), for callbacks that keep the responses."""


def evolrl_train_view(outputs: Any, batch: Any) -> TrainView | None:
    """The view of an ``EvolRLModule.training_step`` output (a :class:`~evolrl.types.StepOutput`)."""
    if not isinstance(outputs, StepOutput):
        return None
    rollouts = outputs.rollouts
    lengths = torch.tensor([[len(r) for r in g.response_ids] for g in rollouts.groups], dtype=torch.float)
    return TrainView(
        rewards=outputs.rewards,
        rollouts=rollouts,
        entropy=outputs.stats["entropy"],
        response_lengths=lengths,
        truncated=rollouts.truncated(),
        step=rollouts.weights_version,
    )


def evolrl_eval_view(outputs: Any, batch: Any) -> EvalView | None:
    """The view of an ``EvolRLModule.validation_step`` / ``test_step`` output (an :class:`~evolrl.types.EvalOutput`)."""
    if not isinstance(outputs, EvalOutput):
        return None
    rollouts = outputs.rollouts
    return EvalView(outputs.dataset, outputs.answers, correct=outputs.correct, step=rollouts.weights_version,
                    ids=[p.id for p in rollouts.prompts], rollouts=rollouts)


class TrainViewCallback(L.Callback):
    """Base of the per-training-step callbacks: extract the view, then :meth:`on_view`.

    Args:
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

    def __init__(self, extract: Callable[[Any, Any], TrainView | None] = evolrl_train_view, prefix: str = "train/"):
        name = type(self).__name__
        require(callable(extract), f"{name}.extract", extract, allowed="a callable (outputs, batch) -> TrainView")
        require(isinstance(prefix, str) and bool(prefix), f"{name}.prefix", prefix, allowed="a non-empty string")
        self.extract = extract
        self.prefix = prefix

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        view = self.extract(outputs, batch)
        if view is not None:
            self.on_view(trainer, pl_module, view)

    def on_view(self, trainer: L.Trainer, pl_module: L.LightningModule, view: TrainView) -> None:
        raise NotImplementedError
