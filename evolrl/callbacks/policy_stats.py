"""Policy entropy and response length per training step, and their epoch means."""

from __future__ import annotations

from evolrl.callbacks.contract import TrainViewCallback


class PolicyStats(TrainViewCallback):
    """Logs ``entropy`` (token mean over response tokens), ``response_length`` (mean),
    ``response_length_max`` and ``truncated_frac`` each step (``train/...``) and their
    epoch means (``train_epoch/...``).

    Args:
        extract: ``(outputs, batch) -> TrainView``; reads evolrl's step output by default.
        prefix: Metric-name prefix.
    """

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
        pl_module.log_dict({epoch_prefix + k: v for k, v in stats.items()}, on_step=False, on_epoch=True,
                           batch_size=size, sync_dist=True)
