"""AdamW with linear warmup and cosine decay, stepped once per optimizer step."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


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


def build_optimizer(params: list[nn.Parameter], cfg: Optimization, total_steps: int):
    # The fused kernel: one pass over all parameters instead of a Python loop over them (much faster
    # for SmolLM2-135M on a CPU); it exists for floating-point parameters on CPU and CUDA.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, total_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
    )
    return optimizer, scheduler


def total_optimizer_steps(trainer, data, mini_batch_size: int) -> int:
    """Optimizer steps in the whole run, for the schedule.

    Counted from the data module rather than with ``trainer.estimated_stepping_batches``, which
    builds the train loader before a checkpoint's loader position is restored, and so loses it.
    """
    if trainer.max_steps and trainer.max_steps > 0:
        return trainer.max_steps
    batches = len(data.train_items) // (data.prompts_per_step * trainer.world_size)
    limit = trainer.limit_train_batches
    batches = min(batches, int(limit)) if isinstance(limit, int) else int(batches * (limit or 1.0))
    per_step = -(-data.prompts_per_step * data.trained_samples // mini_batch_size)
    return max(1, batches * max(1, trainer.max_epochs or 1) * per_step)
