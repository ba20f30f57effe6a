"""pass@k and maj@k per evaluation data set, each validation/test epoch."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L

from evolrl.callbacks.contract import EvalView, evolrl_eval_view
from evolrl.metrics.eval_metrics import EvalMetrics, check_ks
from evolrl.settings import SettingError, require


class PassAtK(L.Callback):
    """Logs ``{stage}/{dataset}/pass@k`` and ``maj@k``, averaged over each data set's problems.

    pass@k is the unbiased estimator; maj@k the exact expected majority-vote accuracy of k of
    the n samples. Each data set has an :class:`~evolrl.metrics.EvalMetrics` metric (torchmetrics): on
    several ranks its per-problem values are gathered by torchmetrics and each problem is counted once (by
    its id), so all ranks report the same table; the metrics are reset at the start of every epoch. With
    ``output_dir``, each epoch's table is also written to ``{output_dir}/{stage}_metrics.json`` and
    ``.csv``. The logging step is the view's ``step`` (the training steps behind the evaluated weights; a
    sanity check before training is step 0), or the trainer's ``global_step`` when the view has none.

    Without ``pass_ks`` the callback reports pass@1 and pass@n, without ``maj_ks`` maj@n, where n is the
    samples per problem of the data set (``data.eval_samples``). A k given explicitly that exceeds n is an
    error at the first evaluation batch, never a silently missing number.

    Args:
        pass_ks: The k of pass@k, each at most the samples per problem; ``None``: 1 and n.
        maj_ks: The k of maj@k, each at most the samples per problem; ``None``: n.
        extract: ``(outputs, batch) -> EvalView``; reads evolrl's step output by default.
        output_dir: Where to write the tables; ``None``: the logger's directory, if any.
    """

    def __init__(
        self,
        pass_ks: Sequence[int] | None = None,
        maj_ks: Sequence[int] | None = None,
        extract: Callable[[Any, Any], EvalView | None] = evolrl_eval_view,
        output_dir: str | None = None,
    ) -> None:
        self.pass_ks = None if pass_ks is None else check_ks("PassAtK.pass_ks", pass_ks)
        self.maj_ks = None if maj_ks is None else check_ks("PassAtK.maj_ks", maj_ks)
        require(callable(extract), "PassAtK.extract", extract, allowed="a callable (outputs, batch) -> EvalView")
        require(output_dir is None or (isinstance(output_dir, str) and bool(output_dir)), "PassAtK.output_dir",
                output_dir, allowed="None (the logger's directory) or a non-empty path")
        self.extract = extract
        self.output_dir = output_dir
        self.metrics: dict[str, EvalMetrics] = {}
        """Data set name -> its metric, made at its first batch (the default ks depend on its samples)."""
        self.step: int | None = None
        self.table: dict[str, dict[str, float]] = {}
        """The last reported table: ``{dataset: {"problems": ..., "samples": ..., "pass@1": ..., "maj@16": ...}}``."""

    def ks_for(self, dataset: str, samples: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(pass_ks, maj_ks)`` for a data set with ``samples`` samples per problem; a :class:`SettingError`
        when an explicit k needs more samples than that."""
        for field, ks in (("pass_ks", self.pass_ks), ("maj_ks", self.maj_ks)):
            over = [k for k in ks or () if k > samples]
            if over:
                raise SettingError(
                    f"PassAtK.{field}={list(ks)} is not allowed: {field[:-3]}@{over[0]} needs at least {over[0]} "
                    f"samples per problem, but evaluation set {dataset!r} has {samples}; raise data.eval_samples "
                    f"to {max(over)} or more, or drop {', '.join(map(str, over))} from the callback's {field} "
                    f"(left unset, it reports pass@1, pass@n and maj@n for the n samples there are)")
        pass_ks = self.pass_ks if self.pass_ks is not None else tuple(dict.fromkeys((1, samples)))
        maj_ks = self.maj_ks if self.maj_ks is not None else (samples,)
        return pass_ks, maj_ks

    def _collect(self, trainer, pl_module, outputs, batch) -> None:
        view = self.extract(outputs, batch)
        if view is None or not len(view.answers):
            return
        samples = min(len(a) for a in view.answers)
        pass_ks, maj_ks = self.ks_for(view.dataset, samples)
        metric = self.metrics.get(view.dataset)
        if metric is None:
            # On the module's device: torchmetrics gathers the states whenever a process group exists, also for one
            # rank (vLLM sets up a one-process group of its own, Lightning's ModelParallelStrategy an NCCL one on a
            # single GPU), and NCCL gathers CUDA tensors only. A single-process CPU run keeps them on the CPU.
            metric = self.metrics[view.dataset] = EvalMetrics(pass_ks, maj_ks).to(pl_module.device)
        metric.update(view.answers, view.correct, view.ids)
        self.step = view.step

    def results(self) -> dict[str, dict[str, float]]:
        """``{dataset: {"problems": ..., "samples": ..., "pass@1": ..., "maj@16": ...}}`` over all ranks so far.

        On several ranks every rank must call it (the metrics gather their states)."""
        rows = {}
        for dataset in sorted(self.metrics):  # the same order on every rank
            metric = self.metrics[dataset]
            if not metric.update_count:
                continue
            values = metric.compute()
            rows[dataset] = {"problems": int(values.pop("problems")), "samples": int(values.pop("samples")),
                             **{name: value.item() for name, value in values.items()}}
        return {dataset: rows[dataset] for dataset in self.metrics if dataset in rows}

    def _reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()

    def _report(self, trainer, pl_module, stage: str) -> None:
        table = self.table = self.results()
        self._reset()
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
        self._reset()
        self.step = None

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, pl_module, outputs=outputs, batch=batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._collect(trainer, pl_module, outputs=outputs, batch=batch)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module, "test")
