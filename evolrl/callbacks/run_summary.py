"""What a run achieved, printed when it ends: the held-out table, and where the curves and the checkpoint are."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from evolrl.callbacks.collapse import CollapseMonitor
from evolrl.callbacks.pass_at_k import PassAtK
from evolrl.settings import check_int

Evaluation = tuple[int, dict[str, dict[str, float]]]
"""``(step, table)``: the training steps behind the evaluated weights, and :attr:`PassAtK.table`."""


class RunSummary(L.Callback):
    """Prints each evaluation set's pass@k and maj@k (from the run's :class:`PassAtK`) when a run ends.

    ``fit`` prints the first and the last evaluation, so the change training made is one glance (the sanity check is
    the first when it evaluates before training; ``num_sanity_val_steps: -1`` makes it cover the whole sets), the
    collapse step and URLVR's Model Collapse Step where a :class:`CollapseMonitor` watched, then the curves'
    directory of each logger and the checkpoint's path. ``validate`` and ``test`` print their table and the file
    :class:`PassAtK` wrote it to. Only the global-zero rank prints (every rank holds the same table), to stdout, at
    the run's teardown. A run without :class:`PassAtK` prints no table.

    Args:
        digits: Decimals of each pass@k and maj@k (0-6).
    """

    def __init__(self, digits: int = 3) -> None:
        check_int("RunSummary.digits", digits, low=0, high=6)
        self.digits = digits
        self.first: Evaluation | None = None
        self.last: Evaluation | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.first = self.last = None

    def on_validation_end(self, trainer, pl_module) -> None:
        evaluation = self._evaluation(trainer)
        if evaluation is not None:
            self.first = self.first or evaluation
            self.last = evaluation

    on_test_end = on_validation_end

    def teardown(self, trainer, pl_module, stage: str) -> None:
        """Printed here, after the progress bar has stopped (``on_fit_end`` comes before that)."""
        if stage == TrainerFn.FITTING:
            self._print(trainer, *self._held_out(), *self._collapse(trainer), *self._paths(trainer))
        elif stage in (TrainerFn.VALIDATING, TrainerFn.TESTING) and self.last is not None:
            title = "Validation" if stage == TrainerFn.VALIDATING else "Test"
            self._print(trainer, f"{title} at step {self.last[0]}:", *self._table([self.last], with_step=False),
                        self._metrics_file(trainer, "val" if stage == TrainerFn.VALIDATING else "test"))

    def _held_out(self) -> list[str]:
        if self.first is None:
            return []
        if self.last is self.first:
            return ["Held-out evaluation:", *self._table([self.first], with_step=True)]
        return ["Held-out evaluation, first and last:", *self._table([self.first, self.last], with_step=True)]

    @staticmethod
    def _collapse(trainer) -> list[str]:
        """The collapse step and URLVR's Model Collapse Step of the run's :class:`CollapseMonitor`, if it has one."""
        monitor = next((c for c in trainer.callbacks if isinstance(c, CollapseMonitor)), None)
        return monitor.summary() if monitor is not None else []

    @staticmethod
    def _paths(trainer) -> list[str]:
        curves = [f"Curves ({type(logger).__name__}): {logger.log_dir}" for logger in trainer.loggers
                  if getattr(logger, "log_dir", None)]
        return [*curves, f"Checkpoint: {checkpoint_path(trainer)}"]

    def _evaluation(self, trainer) -> Evaluation | None:
        """The table the run's :class:`PassAtK` reported last, with its step; ``None`` without one (or a table)."""
        source = pass_at_k(trainer)
        if source is None or not source.table:
            return None
        step = source.step if source.step is not None else trainer.global_step
        return step, {dataset: dict(row) for dataset, row in source.table.items()}

    def _table(self, evaluations: list[Evaluation], with_step: bool) -> list[str]:
        names = list(dict.fromkeys(name for _, table in evaluations for row in table.values() for name in row
                                   if "@" in name))
        header = ["set", *(["step"] if with_step else []), "problems", "samples", *names]
        rows = []
        for dataset in dict.fromkeys(d for _, table in evaluations for d in table):  # each set's rows together
            for step, table in evaluations:
                row = table.get(dataset)
                if row is not None:
                    rows.append([dataset, *([step] if with_step else []), int(row["problems"]), int(row["samples"]),
                                 *(f"{row[name]:.{self.digits}f}" if name in row else "-" for name in names)])
        return format_rows([header, *rows])

    @staticmethod
    def _metrics_file(trainer, stage: str) -> str:
        source = pass_at_k(trainer)
        directory = source.output_dir or (trainer.logger.log_dir if trainer.logger else None)
        return f"Written to {directory}/{stage}_metrics.json" if directory else ""

    @staticmethod
    def _print(trainer, *lines: str) -> None:
        if trainer.is_global_zero:
            print("\n".join(line for line in lines if line), flush=True)


def pass_at_k(trainer) -> PassAtK | None:
    """The trainer's first :class:`PassAtK` callback, if any."""
    return next((c for c in trainer.callbacks if isinstance(c, PassAtK)), None)


def checkpoint_path(trainer) -> str:
    """The best (else the last) checkpoint's path, or why there is none."""
    callback = trainer.checkpoint_callback
    if callback is None:
        return "none (trainer.enable_checkpointing is false)"
    return callback.best_model_path or callback.last_model_path or "none saved"


def format_rows(rows: list[list[Any]]) -> list[str]:
    """Rows as aligned lines, indented by two spaces: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(str(cell).ljust(w) if i == 0 else str(cell).rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
