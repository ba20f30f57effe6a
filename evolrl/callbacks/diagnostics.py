"""Label-free training diagnostics as a callback (METHOD.md section 3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

from evolrl.callbacks.contract import TrainView, evolrl_train_view
from evolrl.metrics.diagnostics import label_free_diagnostics


class LabelFreeDiagnostics(L.Callback):
    """Logs reward mean/std, zero-variance groups, majority ratio, distinct answers, valid rate,
    truncation rate and mean novelty each training step; label and reward accuracy when the
    prompts carry ground truth.

    Args:
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

    def __init__(self, extract: Callable[[Any, Any], TrainView | None] = evolrl_train_view, prefix: str = "train/"):
        self.extract = extract
        self.prefix = prefix

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        view = self.extract(outputs, batch)
        if view is None or view.rewards is None:
            return
        truncated = view.truncated if view.truncated is not None and view.truncated.shape == view.rewards.rewards.shape \
            else None
        stats = label_free_diagnostics(view.rewards, view.truths(), truncated)
        pl_module.log_dict({self.prefix + k: v for k, v in stats.items()}, on_step=True, on_epoch=False,
                           batch_size=view.rewards.rewards.numel())
