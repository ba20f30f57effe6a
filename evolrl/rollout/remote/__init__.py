"""The engine in a sampler process of its own: placement, the weight channel, the process and the trainer's handle."""

from __future__ import annotations

import torch

from evolrl.rollout.remote.client import RemoteSampler, SamplerFailed, pin_trainer
from evolrl.rollout.remote.placement import SamplerProcess, check_placement, trainer_gpus
from evolrl.rollout.remote.worker import SamplerSpec
from evolrl.settings import require

__all__ = ["RemoteSampler", "SamplerFailed", "SamplerProcess", "check_placement", "start_sampler", "trainer_gpus"]


def start_sampler(placement: SamplerProcess, rollouts, model: str, trust_remote_code: bool, longest_prompt: int,
                  evaluates: bool, trainer=None) -> RemoteSampler:
    """The sampler process of this rank of ``trainer`` (a Lightning trainer; ``None``: one CPU process), its placement
    checked, started and joined to its weight channel; this process kept off its cores."""
    rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
    check_placement(placement, world, trainer_gpus(trainer) if trainer is not None else None)
    sleep = getattr(rollouts.engine, "sleep_level", 0)
    require(sleep == 0, "VLLMEngine.sleep_level", sleep,
            allowed="0 with a sampler process of its own (sleep mode frees memory for a trainer beside it)")
    spec = SamplerSpec(rollouts=rollouts, model=model, trust_remote_code=trust_remote_code,
                       longest_prompt=longest_prompt, evaluates=evaluates, rank=rank,
                       cores=placement.sampler_cores(rank),
                       cuda_device=placement.cuda_devices[rank] if placement.cuda_devices else None,
                       timeout_s=placement.timeout_s)
    device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    sampler = RemoteSampler(placement, spec, device)
    sampler.unpinned = pin_trainer(placement)
    return sampler
