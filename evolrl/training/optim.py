"""AdamW with linear warmup and cosine decay, stepped once per optimizer step, over the run's optimizer steps.

The run's length is known only once training has started: its training steps from the trainer (Lightning's
``estimated_stepping_batches``, once the training data is set up) and the optimizer steps per training step from the
first rollout batch. So the schedule (:class:`WarmupCosine`) is built without it and given it at the first training
step (:func:`start_schedule`); it is part of the scheduler's state, so a resumed run keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn

from evolrl.settings import check_float, check_int, require


@dataclass
class Optimization:
    """Optimizer settings (paper defaults)."""

    lr: float = 5e-7
    """Peak AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    warmup_ratio: float = 0.03
    """Fraction of all optimizer steps spent warming up linearly."""
    min_lr_ratio: float = 0.0
    """Cosine decays to ``lr * min_lr_ratio``."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip; a step whose norm is not finite is skipped."""
    max_consecutive_skips: int = 3
    """Optimizer steps in a row with a non-finite gradient norm (each skipped) that a run tolerates; one more stops
    it with an error."""

    def __post_init__(self) -> None:
        check_float("Optimization.lr", self.lr, 0.0)
        require(len(self.betas) == 2, "Optimization.betas", self.betas, allowed="two numbers in [0, 1)")
        for beta in self.betas:
            check_float("Optimization.betas", beta, low=0.0, high=1.0, high_open=True)
        check_float("Optimization.weight_decay", self.weight_decay, 0.0)
        check_float("Optimization.warmup_ratio", self.warmup_ratio, low=0.0, high=1.0)
        check_float("Optimization.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_float("Optimization.max_grad_norm", self.max_grad_norm, 0.0, low_open=True)
        check_int("Optimization.max_consecutive_skips", self.max_consecutive_skips, low=0)


def warmup_cosine(step: int, total: int, warmup_ratio: float, min_lr_ratio: float = 0.0) -> float:
    """LR multiplier at optimizer step ``step`` (0-based) of ``total``.

    Warmup is linear from ``1 / warmup`` (not 0: the first step already learns) to 1 over
    ``warmup = ceil(warmup_ratio * total)`` steps, then cosine down to ``min_lr_ratio``.
    """
    warmup = math.ceil(warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """:func:`warmup_cosine` over ``total`` optimizer steps, a ``LambdaLR`` schedule; ``total`` is set once known
    (:func:`start_schedule`). A callable object, so ``LambdaLR`` keeps ``total`` in its state dict."""

    def __init__(self, warmup_ratio: float, min_lr_ratio: float = 0.0) -> None:
        self.warmup_ratio = warmup_ratio
        self.min_lr_ratio = min_lr_ratio
        self.total: int | None = None

    def __call__(self, step: int) -> float:
        if self.total is None:  # only LambdaLR's first call, at construction: start_schedule sets the real one
            return 1.0
        return warmup_cosine(step, self.total, warmup_ratio=self.warmup_ratio, min_lr_ratio=self.min_lr_ratio)


def build_optimizer(params: list[nn.Parameter], cfg: Optimization):
    """AdamW and its ``LambdaLR`` over a :class:`WarmupCosine` whose length is not set yet (:func:`start_schedule`)."""
    # The fused kernel: one pass over all parameters instead of a Python loop over them (much faster
    # for SmolLM2-135M on a CPU); it exists for floating-point parameters on CPU and CUDA.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(cfg.warmup_ratio, cfg.min_lr_ratio))
    return optimizer, scheduler


def schedule_started(scheduler) -> bool:
    """Whether the schedule knows its length (from :func:`start_schedule`, or a restored checkpoint); another
    scheduler (a subclass's own ``configure_optimizers``) needs none."""
    schedule = getattr(scheduler, "lr_lambdas", [None])[0]
    return not isinstance(schedule, WarmupCosine) or schedule.total is not None


def start_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, total_steps: int) -> None:
    """Give the schedule its length and set the learning rate of the step it is at."""
    schedule = scheduler.lr_lambdas[0]
    schedule.total = total_steps
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * schedule(scheduler.last_epoch)


def start_schedule_once(scheduler, trainer, optimizer_steps: int) -> None:
    """At the first training step (not after a restore): the schedule's length, the run's training steps (the
    trainer's estimate, which needs ``max_steps`` where the data have no length) x ``optimizer_steps`` per step (of
    a step as sampled: one of dynamic sampling may train fewer)."""
    if schedule_started(scheduler):
        return
    steps = trainer.estimated_stepping_batches
    require(steps != float("inf") and steps >= 1, "trainer.max_steps", trainer.max_steps,
            allowed="a positive number of training steps: the training data has no length, so the "
            "learning-rate schedule needs max_steps to know the run's length")
    start_schedule(scheduler, int(steps) * optimizer_steps)


class CountedOnce:
    """The optimizer as the update sees it during one training step of ``steps`` optimizer steps.

    Every step runs through Lightning's strategy (precision plugin, ``on_before_optimizer_step`` hooks), but
    only the last goes through the ``LightningOptimizer``, whose steps Lightning counts: so
    ``trainer.global_step`` counts training steps, like the progress bar and the curves.
    """

    def __init__(self, optimizer: LightningOptimizer, strategy, steps: int) -> None:
        self.optimizer = optimizer
        self.strategy = strategy
        self.steps = steps
        self.calls = 0

    def step(self) -> None:
        self.calls += 1
        if self.calls == self.steps:
            self.optimizer.step()
        else:
            self.strategy.optimizer_step(self.optimizer.optimizer, closure=lambda: None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
