"""pass@k and maj@k per evaluation data set, each validation/test epoch."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L

from evolrl.callbacks.contract import EvalView, evolrl_eval_view
from evolrl.distributed import gather_objects
from evolrl.metrics import maj_at_k, pass_at_k


class PassAtK(L.Callback):
    """Logs ``{stage}/{dataset}/pass@k`` and ``maj@k``, averaged over each data set's problems.

    pass@k is the unbiased estimator; maj@k the exact expected majority-vote accuracy of k of
    the n samples. On several ranks every rank's problems are gathered first (each problem counted
    once, by its id), and all ranks report the same table. With ``output_dir``, each epoch's table is also written to
    ``{output_dir}/{stage}_metrics.json`` and ``.csv``. The logging step is the view's ``step`` (the
    training steps behind the evaluated weights; a sanity check before training is step 0), or the
    trainer's ``global_step`` when the view has none.

    Args:
        pass_ks: The k of pass@k (each at most the samples per problem).
        maj_ks: The k of maj@k.
        extract: ``(outputs, batch) -> EvalView``; reads evolrl's step output by default.
        output_dir: Where to write the tables; ``None``: the logger's directory, if any.
    """

    def __init__(
        self,
        pass_ks: Sequence[int] = (1, 16),
        maj_ks: Sequence[int] = (16,),
        extract: Callable[[Any, Any], EvalView | None] = evolrl_eval_view,
        output_dir: str | None = None,
    ) -> None:
        self.pass_ks = tuple(pass_ks)
        self.maj_ks = tuple(maj_ks)
        self.extract = extract
        self.output_dir = output_dir
        # dataset -> problem key (its id, or its position when the view has no ids) -> (answers, correct)
        self.samples: dict[str, dict[Any, tuple[Sequence[str | None], Sequence[bool]]]] = defaultdict(dict)
        self.step: int | None = None
        self.table: dict[str, dict[str, float]] = {}
        """The last reported table (as :meth:`scores` returns it)."""

    def _collect(self, trainer, outputs, batch) -> None:
        view = self.extract(outputs, batch)
        if view is not None:
            problems = self.samples[view.dataset]
            keys = view.ids if view.ids is not None else [
                (trainer.global_rank, len(problems) + i) for i in range(len(view.answers))]
            for key, answers, correct in zip(keys, view.answers, view.correct):
                problems.setdefault(key, (list(answers), list(correct)))
            self.step = view.step

    def _gather(self) -> None:
        """Every rank's problems on every rank (a problem seen on two ranks is kept once)."""
        merged: dict[str, dict] = defaultdict(dict)
        for samples in gather_objects(dict(self.samples)):
            for dataset, problems in samples.items():
                for key, value in problems.items():
                    merged[dataset].setdefault(key, value)
        self.samples = merged

    def scores(self) -> dict[str, dict[str, float]]:
        """``{dataset: {"pass@1": ..., "maj@16": ..., "problems": ..., "samples": ...}}`` so far."""
        table = {}
        for dataset, by_key in self.samples.items():
            problems = list(by_key.values())
            row: dict[str, float] = {"problems": len(problems), "samples": min(len(a) for a, _ in problems)}
            for k in self.pass_ks:
                if k <= row["samples"]:
                    row[f"pass@{k}"] = sum(pass_at_k(len(c), sum(c), k) for _, c in problems) / len(problems)
            for k in self.maj_ks:
                if k <= row["samples"]:
                    row[f"maj@{k}"] = sum(maj_at_k(a, c, k) for a, c in problems) / len(problems)
            table[dataset] = row
        return table

    def _report(self, trainer, pl_module, stage: str) -> None:
        self._gather()
        table = self.table = self.scores()
        self.samples.clear()
        metrics = {f"{stage}/{dataset}/{name}": value for dataset, row in table.items() for name, value in row.items()
                   if "@" in name}
        # x = training steps behind the evaluated weights, so the sanity check before training is step 0 and
        # the evaluation after step k sits at k (Lightning would log both at 0, and drops the sanity check's).
        step = self.step if self.step is not None else trainer.global_step
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        if not trainer.sanity_checking:
            for name, value in metrics.items():  # for callback_metrics (checkpoint monitors, the CLI's output)
                pl_module.log(name, value, on_epoch=True, add_dataloader_idx=False, logger=False)
        directory = self.output_dir or (trainer.logger.log_dir if trainer.logger else None)
        if directory and trainer.is_global_zero and table:
            path = Path(directory)
            path.mkdir(parents=True, exist_ok=True)
            (path / f"{stage}_metrics.json").write_text(json.dumps({"step": step, **table}, indent=2))
            columns = sorted({name for row in table.values() for name in row})
            with open(path / f"{stage}_metrics.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["dataset", *columns])
                for dataset, row in table.items():
                    writer.writerow([dataset, *(row.get(c, "") for c in columns)])

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.samples.clear()
        self.step = None

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, outputs, batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, outputs, batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module, "test")
