"""The DataModule: label-free prompts in, rollout groups out, never stale.

Lightning fetches batch t+1 before it runs training step t. If that fetch
sampled the rollouts, step t+1 would train on responses from the weights
before step t. So a batch here is a :class:`RolloutRequest` (the prompts,
already tokenized); the module calls ``request.sample()`` inside its training
step, after the previous step's weights reached the engine. The resulting
:class:`~evolrl.types.RolloutBatch` records the engine's weights version, which
the module checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from evolrl.data.chat import PAPER_SYSTEM_PROMPT, render_prompt
from evolrl.data.loader import PromptLoader
from evolrl.data.sources import DataError, EvalSet, PromptSource
from evolrl.models import load_tokenizer
from evolrl.rollout.engine import RolloutEngine, Sampling
from evolrl.rollout.vllm_engine import VLLMEngine
from evolrl.types import Prompt, RolloutBatch


@dataclass(frozen=True)
class RolloutRequest:
    """A batch of prompts whose responses are sampled only when asked (see module docstring)."""

    prompts: tuple[Prompt, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    sampler: Callable[[RolloutRequest], RolloutBatch]
    dataset: str = "train"
    """Name of the data set (an evaluation set's name for validation/test batches)."""
    grader: str = "math"
    """How an evaluation set is graded (``math`` or ``choice``)."""

    def sample(self) -> RolloutBatch:
        """Generate the response groups now, with the engine's current weights."""
        return self.sampler(self)


class RolloutDataModule(L.LightningDataModule):
    """Streams prompts and the rollout groups sampled for them.

    Args:
        train: Where the training prompts come from (``class_path`` of a ``PromptSource``).
        model: The policy's model string, for the tokenizer (linked to ``model.model`` by the CLI).
        engine: Rollout engine; default: vLLM.
        prompts_per_step: P, prompts per training step.
        vote_samples: V, responses sampled per prompt for the vote and the reward.
        trained_samples: G, responses per prompt trained on (a random subset of the V, drawn
            independently of the rewards).
        temperature: Sampling temperature (also used by the policy loss's log-probs).
        top_p: Nucleus sampling.
        top_k: Top-k sampling; -1 for off.
        max_new_tokens: Longest response.
        max_prompt_tokens: Longer prompts are dropped (and counted in a warning), never truncated.
        system_prompt: System message; ``null`` for none.
        shuffle: Shuffle prompts each epoch.
        seed: Seed for shuffling, the trained subset, and sampling.
        trust_remote_code: Allow the tokenizer repository's own code to run.
        eval_sets: Labelled sets for ``validate``/``test`` and validation during ``fit``.
        eval_samples: Responses per evaluation problem (paper: 32).
        eval_temperature: Evaluation sampling temperature (paper: 0.6).
        eval_top_p: Evaluation nucleus sampling (paper: 0.95).
        eval_top_k: Evaluation top-k (the paper's stand-alone evaluation: 20); -1 for off.
        eval_max_new_tokens: Longest evaluation response; ``null``: ``max_new_tokens``.
        eval_prompts_per_batch: Problems per evaluation batch.
    """

    def __init__(
        self,
        train: PromptSource,
        model: str = "",
        engine: RolloutEngine | None = None,
        prompts_per_step: int = 8,
        vote_samples: int = 64,
        trained_samples: int = 32,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        max_new_tokens: int = 12288,
        max_prompt_tokens: int = 1024,
        system_prompt: str | None = PAPER_SYSTEM_PROMPT,
        shuffle: bool = True,
        seed: int = 0,
        trust_remote_code: bool = False,
        eval_sets: list[EvalSet] | None = None,
        eval_samples: int = 32,
        eval_temperature: float = 0.6,
        eval_top_p: float = 0.95,
        eval_top_k: int = -1,
        eval_max_new_tokens: int | None = None,
        eval_prompts_per_batch: int = 8,
    ) -> None:
        super().__init__()
        if not 1 <= trained_samples <= vote_samples:
            raise ValueError(f"trained_samples={trained_samples} must be between 1 and vote_samples={vote_samples}")
        self.source = train
        self.model = model
        self.engine = engine if engine is not None else VLLMEngine()
        self.prompts_per_step = prompts_per_step
        self.trained_samples = trained_samples
        self.sampling = Sampling(vote_samples, temperature, top_p, top_k, max_new_tokens, seed)
        self.max_prompt_tokens = max_prompt_tokens
        self.system_prompt = system_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.trust_remote_code = trust_remote_code
        self.eval_sets = eval_sets or []
        self.eval_sampling = Sampling(eval_samples, eval_temperature, eval_top_p, eval_top_k,
                                      eval_max_new_tokens or max_new_tokens, seed + 1)  # its own random stream
        self.eval_prompts_per_batch = eval_prompts_per_batch
        self.tokenizer = None
        self.train_items: list[tuple[Prompt, tuple[int, ...]]] = []
        self.eval_items: list[list[tuple[Prompt, tuple[int, ...]]]] = []
        self.dropped_prompts = 0
        self._train_loader: PromptLoader | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        if not self.model:
            raise ValueError("RolloutDataModule needs the policy's model string (data.model, linked to model.model)")
        self.tokenizer = load_tokenizer(self.model, self.trust_remote_code)
        self.train_items, self.dropped_prompts = self._encode(self.source.load(), "training")
        self.eval_items = [self._encode(s.load(), f"evaluation set {s.name!r}")[0] for s in self.eval_sets]
        rank, world = self._rank_and_world()
        if len(self.train_items) < self.prompts_per_step * world:
            raise DataError(
                f"{len(self.train_items)} usable prompts but prompts_per_step={self.prompts_per_step} on each of "
                f"{world} ranks: add prompts or lower prompts_per_step"
            )
        longest_prompt = max(len(ids) for items in (self.train_items, *self.eval_items) for _, ids in items)
        self.engine.setup(
            self.tokenizer,
            max_sequences=max(self.prompts_per_step * self.sampling.n,
                              self.eval_prompts_per_batch * self.eval_sampling.n if self.eval_sets else 0),
            max_tokens=longest_prompt + max(self.sampling.max_new_tokens, self.eval_sampling.max_new_tokens),
            stream=rank,
        )

    def _rank_and_world(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)

    def _encode(self, prompts: list[Prompt], what: str) -> tuple[list[tuple[Prompt, tuple[int, ...]]], int]:
        """Rendered, tokenized prompts within ``max_prompt_tokens``, and how many were dropped (with a warning)."""
        encoded = [(p, tuple(render_prompt(self.tokenizer, p.question, self.system_prompt))) for p in prompts]
        kept = [(p, ids) for p, ids in encoded if len(ids) <= self.max_prompt_tokens]
        dropped = len(encoded) - len(kept)
        if dropped:
            rank_zero_warn(f"{what}: dropped {dropped} of {len(encoded)} prompts longer than "
                           f"max_prompt_tokens={self.max_prompt_tokens}")
        return kept, dropped

    def train_dataloader(self) -> PromptLoader:
        # Every step has P full groups (the last partial batch is dropped); the loader's position is
        # part of each checkpoint, so a resumed run sees the same next batches.
        if self._train_loader is None:
            rank, world = self._rank_and_world()
            self._train_loader = PromptLoader(self.train_items, self.prompts_per_step, self._request, self.shuffle,
                                              self.seed, rank, world)
        return self._train_loader

    def _eval_loaders(self) -> list[DataLoader]:
        def request(items, eval_set):
            return RolloutRequest(tuple(p for p, _ in items), tuple(ids for _, ids in items), self._sample_eval,
                                  eval_set.name, eval_set.grader)

        return [
            DataLoader(items, batch_size=self.eval_prompts_per_batch, shuffle=False,
                       collate_fn=lambda batch, s=eval_set: request(batch, s))
            for items, eval_set in zip(self.eval_items, self.eval_sets)
        ]

    def val_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders()

    def test_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders()

    def _sample_eval(self, request: RolloutRequest) -> RolloutBatch:
        groups = self.engine.generate(request.prompts, request.prompt_ids, self.eval_sampling)
        return RolloutBatch(tuple(groups), weights_version=self.engine.version)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        # A request holds token ids as tuples; the module builds its tensors on the device.
        return batch if isinstance(batch, RolloutRequest) else super().transfer_batch_to_device(batch, device,
                                                                                                dataloader_idx)

    def _request(self, items: list[tuple[Prompt, tuple[int, ...]]]) -> RolloutRequest:
        return RolloutRequest(tuple(p for p, _ in items), tuple(ids for _, ids in items), self._sample)

    def _sample(self, request: RolloutRequest) -> RolloutBatch:
        groups = self.engine.generate(request.prompts, request.prompt_ids, self.sampling)
        version = self.engine.version
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + version)
        trained = torch.stack(
            [torch.randperm(self.sampling.n, generator=g)[: self.trained_samples] for _ in groups]
        )  # [P, G]
        return RolloutBatch(tuple(groups), weights_version=version, trained=trained)
