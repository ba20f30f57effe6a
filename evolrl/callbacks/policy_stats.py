"""Policy entropy and response length per training step, and their epoch means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchmetrics import MeanMetric

from evolrl.callbacks.contract import TrainView, TrainViewCallback, evolrl_train_view


class PolicyStats(TrainViewCallback):
    """Logs ``entropy`` (token mean over response tokens), ``response_length`` (mean),
    ``response_length_max`` and ``truncated_frac`` each step (``train/...``) and their
    epoch means (``train_epoch/...``).

    The epoch means are ``torchmetrics.MeanMetric`` s (weighted by the responses of each step) logged with
    ``pl_module.log``: torchmetrics averages them over all ranks, Lightning computes them at the end of the
    epoch and resets them.

    Args:
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

    def __init__(self, extract: Callable[[Any, Any], TrainView | None] = evolrl_train_view, prefix: str = "train/"):
        super().__init__(extract, prefix)
        self.epoch_means: dict[str, MeanMetric] = {}
        """Metric name -> its epoch mean."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        for mean in self.epoch_means.values():
            mean.reset()
            mean.to(pl_module.device)  # states on the device the ranks sync from

    def on_view(self, trainer, pl_module, view) -> None:
        stats = {}
        if view.entropy is not None:
            stats["entropy"] = float(view.entropy)
        if view.response_lengths is not None:
            lengths = view.response_lengths.float()
            stats["response_length"] = lengths.mean().item()
            stats["response_length_max"] = lengths.max().item()
        if view.truncated is not None:
            stats["truncated_frac"] = view.truncated.float().mean().item()
        size = view.response_lengths.numel() if view.response_lengths is not None else 1
        pl_module.log_dict({self.prefix + k: v for k, v in stats.items()}, on_step=True, on_epoch=False,
                           batch_size=size)
        epoch_prefix = self.prefix.rstrip("/") + "_epoch/"
        for k, v in stats.items():
            name = epoch_prefix + k
            if name not in self.epoch_means:
                self.epoch_means[name] = MeanMetric().to(pl_module.device)
            mean = self.epoch_means[name]
            mean.update(v, weight=size)
            # The metric lives in this callback, not in the module: name it for Lightning's bookkeeping.
            pl_module.log(name, mean, on_step=False, on_epoch=True, metric_attribute=f"{type(self).__name__}:{name}")
