"""A few (prompt, response, answer, reward) rows per step, as TensorBoard text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from evolrl.callbacks.contract import TrainView, evolrl_train_view
from evolrl.settings import check_int, require


def sample_table(view: TrainView, rows: int) -> str:
    """A Markdown table of the first ``rows`` prompts, each with its first scored response (a reward that reads the
    policy scores only the trained ones; the others are NaN)."""
    lines = ["| prompt | response | answer | reward |", "|---|---|---|---|"]

    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")[:500]

    for p, group in enumerate(view.rollouts.groups[:rows]):
        scored = [] if view.rewards is None else (~view.rewards.rewards[p].isnan()).nonzero().flatten().tolist()
        v = scored[0] if scored else 0
        answer = view.rewards.answers[p][v] if view.rewards is not None else None
        reward = f"{view.rewards.rewards[p, v].item():.3f}" if view.rewards is not None else ""
        lines.append(f"| {cell(group.prompt.question)} | {cell(group.texts[v])} | {cell(answer)} | {reward} |")
    return "\n".join(lines)


class SampleLogger(L.Callback):
    """Writes ``rows`` sample rows to the TensorBoard text tab every ``every_n_steps`` training steps.

    The rows sit at the view's ``step`` (the training step whose responses they show: the x of the scalars
    logged from that ``training_step``), and ``every_n_steps`` counts that step, so both go on across epochs.
    A view without a ``step`` falls back to ``trainer.global_step``, which at the end of a training batch
    already counts that batch's optimizer step (one ahead of Lightning's x for that step's scalars); a module
    that wants the rows lined up with its curves puts the step in its ``TrainView``.

    Args:
        rows: Prompts shown per step (first response of each).
        every_n_steps: Logging interval in training steps (steps 0, n, 2n, ...).
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        tag: TensorBoard text tag.
    """

    def __init__(
        self,
        rows: int = 4,
        every_n_steps: int = 1,
        extract: Callable[[Any, Any], TrainView | None] = evolrl_train_view,
        tag: str = "train/samples",
    ) -> None:
        check_int("SampleLogger.rows", rows, 1)
        check_int("SampleLogger.every_n_steps", every_n_steps, 1)
        require(callable(extract), "SampleLogger.extract", extract, allowed="a callable (outputs, batch) -> TrainView")
        require(isinstance(tag, str) and bool(tag), "SampleLogger.tag", tag, allowed="a non-empty string")
        self.rows = rows
        self.every_n_steps = every_n_steps
        self.extract = extract
        self.tag = tag

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero:
            return
        view = self.extract(outputs, batch)
        if view is None or view.rollouts is None:
            return
        step = view.step if view.step is not None else trainer.global_step
        if step % self.every_n_steps:
            return
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text(self.tag, sample_table(view, self.rows), global_step=step)
