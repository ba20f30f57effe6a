"""Label-free training diagnostics as a callback (docs/method.md, section 3)."""

from __future__ import annotations

from evolrl.callbacks.contract import TrainViewCallback
from evolrl.metrics.diagnostics import label_free_diagnostics


class LabelFreeDiagnostics(TrainViewCallback):
    """Logs reward mean/std, zero-variance groups, majority ratio, distinct answers, valid rate, truncation rate,
    mean novelty and its groups' spread before scaling (``novelty_spread_mean``), and the fraction of responses with
    text after their final answer (``trailing_fraction``, as the reward read the answer) each training step; label
    and reward accuracy when the prompts carry ground truth.

    Args:
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

    def on_view(self, trainer, pl_module, view) -> None:
        if view.rewards is None:
            return
        shape = view.rewards.rewards.shape
        truncated = view.truncated if view.truncated is not None and view.truncated.shape == shape else None
        stats = label_free_diagnostics(view.rewards, view.truths(), truncated)
        pl_module.log_dict({self.prefix + k: v for k, v in stats.items()}, on_step=True, on_epoch=False,
                           batch_size=shape.numel())
