"""Every evaluation response to a file, for measures that need the texts (where the answer sits, lengths)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L

from evolrl.callbacks.contract import EvalView, evolrl_eval_view
from evolrl.settings import require


class EvalResponses(L.Callback):
    """Writes each validation/test epoch's responses to ``{output_dir}/{stage}_responses_step{step}.jsonl``.

    One line per problem: ``dataset``, ``id``, ``question``, ``truth`` and ``responses``, a list of ``text``,
    ``answer`` (as graded), ``correct`` and ``tokens`` (sampled token ids, stop token included). ``step`` is the
    view's (training steps behind the evaluated weights), so a run's evaluations do not overwrite each other.
    Rank zero writes what it evaluated.

    Args:
        extract: ``(outputs, batch) -> EvalView`` with its ``rollouts``; reads evolrl's step output by default.
        output_dir: Where to write; ``None``: the logger's directory (nothing is written without either).
    """

    def __init__(self, extract: Callable[[Any, Any], EvalView | None] = evolrl_eval_view,
                 output_dir: str | None = None) -> None:
        require(callable(extract), "EvalResponses.extract", extract, allowed="a callable (outputs, batch) -> EvalView")
        require(output_dir is None or (isinstance(output_dir, str) and bool(output_dir)), "EvalResponses.output_dir",
                output_dir, allowed="None (the logger's directory) or a non-empty path")
        self.extract = extract
        self.output_dir = output_dir
        self.rows: list[dict] = []
        self.step: int | None = None

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.rows, self.step = [], None

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        view = self.extract(outputs, batch)
        if view is None or view.rollouts is None:
            return
        self.step = view.step
        for group, answers, correct in zip(view.rollouts.groups, view.answers, view.correct):
            ids = group.response_ids or [None] * len(group.texts)
            self.rows.append({
                "dataset": view.dataset, "id": group.prompt.id, "question": group.prompt.question,
                "truth": group.prompt.answer,
                "responses": [{"text": t, "answer": a, "correct": bool(c), "tokens": None if r is None else list(r)}
                              for t, a, c, r in zip(group.texts, answers, correct, ids)],
            })

    on_test_batch_end = on_validation_batch_end

    def _write(self, trainer, stage: str) -> None:
        directory = self.output_dir or (trainer.logger.log_dir if trainer.logger else None)
        if not directory or not trainer.is_global_zero or not self.rows:
            return
        step = self.step if self.step is not None else trainer.global_step
        path = Path(directory) / f"{stage}_responses_step{step}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in self.rows))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._write(trainer, "val")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._write(trainer, "test")
