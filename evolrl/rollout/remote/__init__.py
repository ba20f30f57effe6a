"""The engine in a sampler process of its own: placement, the weight channel, the process and the trainer's handle."""

from __future__ import annotations

import copy

import torch

from evolrl.rollout.remote.client import RemoteSampler, SamplerFailed, pin_trainer
from evolrl.rollout.remote.placement import SamplerProcess, check_placement, trainer_gpus
from evolrl.rollout.remote.worker import SamplerSpec
from evolrl.settings import require

__all__ = ["RemoteSampler", "SamplerFailed", "SamplerProcess", "check_placement", "start_sampler", "trainer_gpus"]


def start_sampler(placement: SamplerProcess, rollouts, model: str, trust_remote_code: bool, longest_prompt: int,
                  evaluates: bool, rank: int, device: torch.device | None) -> RemoteSampler:
    """Rank ``rank``'s sampler process, started and joined to its weight channel; this process kept off its cores."""
    sleep = getattr(rollouts.engine, "sleep_level", 0)
    require(sleep == 0, "VLLMEngine.sleep_level", sleep,
            allowed="0 with a sampler process of its own (sleep mode frees memory for a trainer beside it)")
    spec = SamplerSpec(rollouts=copy.copy(rollouts), model=model, trust_remote_code=trust_remote_code,
                       longest_prompt=longest_prompt, evaluates=evaluates, rank=rank,
                       cores=placement.sampler_cores(rank),
                       cuda_device=placement.cuda_devices[rank] if placement.cuda_devices else None,
                       timeout_s=placement.timeout_s)
    sampler = RemoteSampler(placement, spec, device if device is not None else torch.device("cpu"))
    sampler.unpinned = pin_trainer(placement)
    return sampler
