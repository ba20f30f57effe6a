"""The engine in a sampler process of its own: placement, the weight channel, the process and the trainer's handle."""

from __future__ import annotations

import torch

from evolrl.rollout.remote.client import RemoteSampler, SamplerFailed, pin_trainer
from evolrl.rollout.remote.placement import SamplerPlacement, check_placement, trainer_gpus
from evolrl.rollout.remote.worker import SamplerSpec

__all__ = ["RemoteSampler", "SamplerFailed", "SamplerPlacement", "check_placement", "start_sampler",
           "trainer_gpus"]


def start_sampler(placement: SamplerPlacement, rollouts, model: str, trust_remote_code: bool, longest_prompt: int,
                  evaluates: bool, trainer=None) -> RemoteSampler:
    """The sampler process of this rank of ``trainer`` (a Lightning trainer; ``None``: one CPU process), started and
    joined to its weight channel; this process kept off its cores. Its placement against the run's settings is
    ``evolrl.run_check``'s, before it starts."""
    rank = trainer.global_rank if trainer is not None else 0
    spec = SamplerSpec(rollouts=rollouts, model=model, trust_remote_code=trust_remote_code,
                       longest_prompt=longest_prompt, evaluates=evaluates, rank=rank,
                       cores=placement.sampler_cores(rank),
                       cuda_device=placement.cuda_devices[rank] if placement.cuda_devices else None,
                       timeout_s=placement.timeout_s)
    device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    sampler = RemoteSampler(placement, spec, device)
    sampler.unpinned = pin_trainer(placement)
    return sampler
