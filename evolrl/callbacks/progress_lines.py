"""Progress as lines, for output that goes to a file (SLURM's ``--output``, ``nohup``, CI) rather than a terminal.

A terminal bar redraws one line in place, and a log file receives nothing readable from it until the run ends.
:class:`LineProgress` prints one plain line every ``every_n_steps`` training steps or ``every_s`` seconds, whichever
comes first, and one after each evaluation. ``python -m evolrl`` uses it instead of the bar when standard output is
not a terminal; it is a Lightning ``ProgressBar``, so any trainer can take it in its callbacks.
"""

from __future__ import annotations

import sys
import time

from lightning.pytorch.callbacks.progress import ProgressBar

from evolrl.callbacks.run_summary import pass_at_k
from evolrl.settings import check_float, check_int

SHOWN = {"reward": "reward {:.3f}", "entropy": "entropy {:.3f}", "len": "length {:.1f}"}
"""The step's progress-bar values a line shows, in this order (``EvolRLModule.training_step`` logs them)."""


class LineProgress(ProgressBar):
    """One line per ``every_n_steps`` steps or ``every_s`` seconds: the step, its time, reward, entropy, length;
    after each evaluation, its pass@1 per set.

    Args:
        every_n_steps: Steps between lines; ``null``: the trainer's ``log_every_n_steps``.
        every_s: At most this many seconds between lines (checked at each step's end).
    """

    def __init__(self, every_n_steps: int | None = None, every_s: float = 60.0) -> None:
        super().__init__()
        if every_n_steps is not None:
            check_int("LineProgress.every_n_steps", every_n_steps, low=1)
        check_float("LineProgress.every_s", every_s, low=0.0, low_open=True)
        self.every_n_steps, self.every_s = every_n_steps, every_s
        self._enabled = True
        self.started = self.last_line = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.trainer.is_global_zero

    def _line(self, text: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        print(f"[{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}] {text}", file=sys.stdout, flush=True)
        self.last_line = time.monotonic()

    def _step(self, trainer) -> str:
        total = trainer.max_steps if trainer.max_steps > 0 else self.total_train_batches
        return f"step {trainer.global_step}/{total if total != float('inf') else '?'}"

    def on_fit_start(self, trainer, module) -> None:
        self.started = self.last_line = time.monotonic()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if not self.is_enabled:
            return
        every = self.every_n_steps or trainer.log_every_n_steps
        if trainer.global_step % every and time.monotonic() - self.last_line < self.every_s:
            return
        metrics = trainer.progress_bar_metrics
        parts = [self._step(trainer)]
        if "step_s" in metrics:
            parts.append(f"{metrics['step_s']:.1f} s/step")
        parts += [form.format(metrics[key]) for key, form in SHOWN.items() if key in metrics]
        self._line("  ".join(parts))

    def on_validation_end(self, trainer, module) -> None:
        if not self.is_enabled:
            return
        source = pass_at_k(trainer)
        table = source.table if source is not None else {}
        what = "before training:" if trainer.sanity_checking else f"{self._step(trainer)}  evaluation"
        shown = "  ".join(f"{name} pass@1 {row['pass@1']:.3f}" for name, row in table.items() if "pass@1" in row)
        self._line(what + (f"  {shown}" if shown else ""))
