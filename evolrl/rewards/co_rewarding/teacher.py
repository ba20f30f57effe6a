"""The EMA teacher of Co-rewarding II (:class:`~evolrl.rewards.CoRewardingReward`): a slow average of the policy
whose votes give the pseudo-labels.

Decisions:

* The teacher is an exponential moving average of the policy's *trainable* tensors: under LoRA the adapters alone
  (the base is shared, so no second model exists), otherwise every parameter, one more copy of the weights in the
  policy's dtype (the optimizer's float32 master weights by default: an average that moves by ``1 - decay`` of 1e-4
  would round away in bfloat16). ``python -m tools.commands.gpu_budget --teacher`` counts it.
* Each step, as the paper's Algorithm 2: the policy samples, the teacher moves towards that policy
  (``teacher <- decay * teacher + (1 - decay) * policy``, the decay cosine-annealed from ``decay`` to
  ``final_decay`` over the run), then the teacher samples the same prompts, then the update.
* The teacher samples through the run's engine: its tensors are swapped into the policy's parameters (no copy), the
  engine takes the weights as it takes the policy's (free for ``HFEngine``, which samples with the policy itself; a
  push for vLLM), samples, and gets the policy's weights back, at the same version. A second engine would hold a
  second model in memory for what costs one push here; ``time/teacher`` logs the cost per step.
* Its tensors go into every checkpoint, so a resumed run continues the same average.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from evolrl.settings import require
from evolrl.types import RolloutBatch


class EMATeacher:
    """The teacher's tensors: an average of ``policy``'s trainable parameters, starting equal to them."""

    def __init__(self, policy: nn.Module) -> None:
        self.tensors = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        require(bool(self.tensors), "the EMA teacher", "no trainable parameter", allowed="a policy that trains")

    def parameters(self, policy: nn.Module) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        names = dict(policy.named_parameters())
        for name, tensor in self.tensors.items():
            yield names[name], tensor

    @torch.no_grad()
    def update(self, policy: nn.Module, decay: float) -> None:
        """``teacher <- decay * teacher + (1 - decay) * policy``."""
        for param, tensor in self.parameters(policy):
            tensor.lerp_(param.detach().to(tensor.dtype), 1.0 - decay)

    @contextmanager
    def swapped_into(self, policy: nn.Module) -> Iterator[None]:
        """The policy's parameters hold the teacher's tensors inside the block (their data swapped, no copy)."""
        pairs = list(self.parameters(policy))
        held = [param.data for param, _ in pairs]
        for param, tensor in pairs:
            param.data = tensor
        try:
            yield
        finally:
            for (param, _), data in zip(pairs, held):
                param.data = data

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().cpu().clone() for n, t in self.tensors.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.tensors) ^ set(state)
        require(not missing, "the checkpoint's EMA teacher", f"{len(missing)} tensors differ, e.g. {min(missing)!r}"
                if missing else "", allowed="the tensors of this run's trainable parameters (same model and LoRA)")
        for name, tensor in self.tensors.items():
            tensor.copy_(state[name])


def decay_at(step: int, total: int, decay: float, final_decay: float | None) -> float:
    """The decay at training ``step`` (0-based) of ``total``: cosine from ``decay`` at the first step to
    ``final_decay`` at the last (Co-rewarding's Eq. 11 schedule), constant without a final one."""
    if final_decay is None or total <= 1:
        return decay
    t = min(max(step, 0), total - 1) / (total - 1)
    return final_decay + 0.5 * (decay - final_decay) * (1 + math.cos(math.pi * t))


def teacher_sampler(teacher: EMATeacher, policy: nn.Module, rollouts, samples: int, step: int
                    ) -> Callable[[RolloutBatch], RolloutBatch]:
    """``batch -> the teacher's samples`` of the same prompts, through ``rollouts`` (the run's
    :class:`~evolrl.rollout.Rollouts`), ``samples`` each, seeded by the step and the call (dynamic sampling's rounds
    call it once each)."""
    calls = iter(range(1 << 30))

    def sample(batch: RolloutBatch) -> RolloutBatch:
        engine, version = rollouts.engine, rollouts.engine.version
        seed = rollouts.seeds.teacher(step, rollouts.rank, next(calls))
        prompts, ids = [g.prompt for g in batch.groups], [g.prompt_ids for g in batch.groups]
        try:
            with teacher.swapped_into(policy):
                engine.load_weights(policy, version=version)
                groups = engine.generate(prompts, ids, sampling=rollouts.sampling, n=samples, seed=seed)
        finally:
            engine.load_weights(policy, version=version)  # the policy's weights, for the step's further rounds
        return RolloutBatch(tuple(groups), weights_version=version, temperature=rollouts.sampling.temperature,
                            max_new_tokens=rollouts.sampling.max_new_tokens)

    return sample
