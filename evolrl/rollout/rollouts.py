"""Rollout orchestration: one engine, how it samples for training and for evaluation, which weights it holds.

:class:`Rollouts` is the one place where the engine is sized, the trained G of each group's V
responses are drawn, the weights version is counted and sampling seeds are taken from
:class:`~evolrl.rollout.seeds.Seeds`. The data module builds it, samples through it and hands it the weights the
training step gives (``sampler.py``). Its state (the weights version) is part of every checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from evolrl.rollout.engine import RolloutEngine, Sampling
from evolrl.rollout.seeds import Seeds
from evolrl.settings import check_int, require
from evolrl.types import Prompt, RolloutBatch


class Rollouts:
    """Samples training groups (V responses, G of them trained) and evaluation groups with one engine.

    Args:
        engine: The rollout engine.
        sampling: Training sampling; its temperature is also the policy loss's.
        eval_sampling: Evaluation sampling.
        prompts_per_step: P, prompts per training step (on each rank).
        vote_samples: V, responses per training prompt (the vote and the reward see all of them).
        trained_samples: G, responses per prompt trained on, drawn independently of the rewards.
        eval_samples: Responses per evaluation problem.
        eval_prompts_per_batch: Evaluation problems per ``generate`` call.
        seeds: The run's random streams.
    """

    def __init__(self, engine: RolloutEngine, sampling: Sampling, eval_sampling: Sampling, prompts_per_step: int,
                 vote_samples: int, trained_samples: int, eval_samples: int, eval_prompts_per_batch: int,
                 seeds: Seeds) -> None:
        check_int("prompts_per_step", prompts_per_step, 1)
        check_int("vote_samples", vote_samples, 1)
        check_int("trained_samples", trained_samples, 1)
        require(trained_samples <= vote_samples, "trained_samples", trained_samples,
                allowed=f"at most vote_samples={vote_samples} (G of the V sampled responses are trained on)")
        check_int("eval_samples", eval_samples, 1)
        check_int("eval_prompts_per_batch", eval_prompts_per_batch, 1)
        self.engine = engine
        self.sampling = sampling
        self.eval_sampling = eval_sampling
        self.prompts_per_step = prompts_per_step
        self.vote_samples = vote_samples
        self.trained_samples = trained_samples
        self.eval_samples = eval_samples
        self.eval_prompts_per_batch = eval_prompts_per_batch
        self.seeds = seeds
        self.rank = 0
        """This process's data-parallel rank (set by :meth:`setup`): its own samples and engine seed."""
        self.version = -1
        """Version of the weights last handed to the engine (-1: none yet)."""
        self.loaded = False
        """Whether the engine holds the weights of ``version`` (false again after a checkpoint is restored)."""

    @property
    def temperature(self) -> float:
        """The training temperature: the policy's log-probs are those of ``softmax(logits / temperature)``."""
        return self.sampling.temperature

    def setup(self, tokenizer: PreTrainedTokenizerBase, longest_prompt: int, evaluates: bool, rank: int = 0) -> None:
        """Size the engine for the largest call this run makes and give it this rank's seed."""
        self.rank = rank
        calls = [(self.prompts_per_step * self.vote_samples, self.sampling.max_new_tokens)]
        if evaluates:
            calls.append((self.eval_prompts_per_batch * self.eval_samples, self.eval_sampling.max_new_tokens))
        self.engine.setup(tokenizer, max_sequences=max(n for n, _ in calls),
                          max_tokens=longest_prompt + max(t for _, t in calls), seed=self.seeds.engine(self.rank))

    def push(self, policy: nn.Module, new_version: bool = True, load=None) -> None:
        """Hand the policy's weights to the engine, as the next version or (``new_version=False``) as the current one
        again (a resumed run, or evaluation without training); ``load(policy, version=...)``: how they get there
        (default: the engine's ``load_weights``; a sampler process's push)."""
        if new_version or self.version < 0:
            self.version += 1
        (load or self.engine.load_weights)(policy, version=self.version)
        self.loaded = True

    def sample(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], round: int = 0,
               index: int | None = None) -> RolloutBatch:
        """V responses per prompt with the current weights, and the G of each group to train on (``trained``);
        ``round``: which of the step's sampling rounds (dynamic sampling), each with its own seeds. Seeds follow the
        weights version, or ``index``, the batch's place in the run, where several batches share a version
        (``data.max_staleness``)."""
        version = self.engine.version
        key = version if index is None else index
        seed, subset = (self.seeds.further_round(key, self.rank, round) if round else
                        (self.seeds.sampling(key, self.rank), self.seeds.trained_subset(key)))
        groups = self.engine.generate(prompts, prompt_ids, sampling=self.sampling, n=self.vote_samples, seed=seed)
        g = torch.Generator().manual_seed(subset)
        trained = torch.stack(
            [torch.randperm(self.vote_samples, generator=g)[: self.trained_samples] for _ in groups]
        )  # [P, G]
        return RolloutBatch(tuple(groups), weights_version=version, trained=trained,
                            temperature=self.sampling.temperature, max_new_tokens=self.sampling.max_new_tokens)

    def sample_eval(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]]) -> RolloutBatch:
        """``eval_samples`` responses per evaluation problem with the current weights."""
        version = self.engine.version
        groups = self.engine.generate(prompts, prompt_ids, sampling=self.eval_sampling, n=self.eval_samples,
                                      seed=self.seeds.sampling(version, self.rank, evaluation=True))
        return RolloutBatch(tuple(groups), weights_version=version, temperature=self.eval_sampling.temperature,
                            max_new_tokens=self.eval_sampling.max_new_tokens)

    def state_dict(self) -> dict[str, int]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.version = state["version"]
        self.loaded = False  # the restored weights still have to reach the engine
