"""The DataModule: label-free prompts in, rollout groups out, at most ``max_staleness`` versions old.

This is the rollout side's one owner: it builds :attr:`RolloutDataModule.rollouts` (the engine, the sampling, the
weights version; see :class:`~evolrl.rollout.Rollouts`) and is the training step's :class:`~evolrl.types.Sampler`:
the step takes its rollouts (``next_rollouts``) and hands over the new weights (``hand_weights``) by name. Its
loaders yield :class:`~evolrl.data.requests.RolloutRequest` batches, plain prompts that the step hands back to be
sampled (Lightning fetches a batch ahead; the off-policy line, a sampler process: ``evolrl/rollout/supply.py``); a
rollout batch records its weights version, which the module checks, and its temperature. A hash of the training
prompts travels in checkpoints: a resume refuses others.
"""

from __future__ import annotations

import hashlib
import time
from functools import partial

import lightning as L
from torch.utils.data import DataLoader

from evolrl.data.chat import PromptFormat, encode_prompts
from evolrl.data.eval_set import EvalSet
from evolrl.data.loader import PromptLoader
from evolrl.data.requests import RolloutRequest
from evolrl.data.sources import DataError, PromptSource, require_answers
from evolrl.models import load_tokenizer
from evolrl.rollout import DynamicSampling, Rollouts, Sampling, Seeds
from evolrl.rollout.engine import RolloutEngine
from evolrl.rollout.ranks import fail_together
from evolrl.rollout.remote import SamplerPlacement, start_sampler
from evolrl.rollout.supply import RolloutSupply
from evolrl.rollout.vllm_engine import VLLMEngine
from evolrl.run_check import check_run
from evolrl.settings import check_int, require
from evolrl.types import Prompt, RolloutBatch


class RolloutDataModule(L.LightningDataModule):
    """Streams prompts and the rollout groups sampled for them.

    Args:
        train: Where the training prompts come from (``class_path`` of a ``PromptSource``).
        model: The policy's model string, for the tokenizer (linked to ``model.model`` by the CLI).
        engine: Rollout engine; default: vLLM.
        prompts_per_step: P, prompts per training step (on each rank).
        vote_samples: V, responses sampled per prompt for the vote and the reward.
        trained_samples: G, responses per prompt trained on (a random subset of the V, drawn
            independently of the rewards).
        sampling: How training responses are sampled; its temperature is also the policy loss's.
        prompt: How a question becomes the policy's prompt, training and evaluation alike: the system message,
            worked examples as chat turns (few-shot), and the longest prompt kept.
        shuffle: Shuffle prompts each epoch.
        seed: The run's seed for shuffling, the trained subset and sampling (see ``evolrl.rollout.Seeds``);
            ``null`` (default): the CLI's ``seed_everything`` (0 where that is ``false`` or outside the CLI).
        trust_remote_code: Allow the tokenizer repository's own code to run.
        eval_sets: Labelled sets for ``validate``/``test`` and validation during ``fit``.
        eval_samples: Responses per evaluation problem (paper: 32).
        eval_sampling: How evaluation responses are sampled; ``null``: the paper's temperature 0.6 and
            top_p 0.95, with the training ``max_new_tokens`` and ``stop``.
        eval_prompts_per_batch: Problems per evaluation batch.
        dynamic_sampling: Drop groups whose trained rewards all agree and sample further prompts in their place
            (DAPO; ``max_rounds``); ``null``: off.
        allow_changed_prompts: Resume from a checkpoint whose training prompts differ from these (a hash of them
            travels in the checkpoint); false: refuse, since the loader's position would point into other prompts.
        max_staleness: k, how many weight versions a trained batch may lag (TRL's ``max_staleness``, prime-rl's
            ``async_level``): batches are sampled k steps ahead, with a mismatch correction; 0: on-policy, as the paper.
        sampler_process: Run the engine in a process of its own per rank, on cores or a GPU of its own (with k >= 1
            it samples while the trainer updates); ``null``: in the training process.
    """

    def __init__(
        self,
        train: PromptSource,
        model: str = "",
        engine: RolloutEngine | None = None,
        prompts_per_step: int = 8,
        vote_samples: int = 64,
        trained_samples: int = 32,
        sampling: Sampling = Sampling(),  # noqa: B008 (frozen)
        prompt: PromptFormat = PromptFormat(),  # noqa: B008 (frozen)
        shuffle: bool = True,
        seed: int | None = None,
        trust_remote_code: bool = False,
        eval_sets: list[EvalSet] | None = None,
        eval_samples: int = 32,
        eval_sampling: Sampling | None = None,
        eval_prompts_per_batch: int = 8,
        dynamic_sampling: DynamicSampling | None = None,
        allow_changed_prompts: bool = False,
        max_staleness: int = 0,
        sampler_process: SamplerPlacement | None = None,
    ) -> None:
        super().__init__()
        if len(set(names := [s.name for s in eval_sets or []])) != len(names):
            raise DataError(f"eval_sets: two evaluation sets share a name ({names}); metric tags need unique names")
        self.source = train
        self.model = model
        check_int("RolloutDataModule.seed", 0 if seed is None else seed, 0)
        self.seeds = Seeds(0 if seed is None else seed)
        eval_sampling = eval_sampling or Sampling(temperature=0.6, top_p=0.95, max_new_tokens=sampling.max_new_tokens,
                                                  stop=sampling.stop)
        self.rollouts = Rollouts(engine if engine is not None else VLLMEngine(), sampling, eval_sampling=eval_sampling,
                                 prompts_per_step=prompts_per_step, vote_samples=vote_samples,
                                 trained_samples=trained_samples, eval_samples=eval_samples,
                                 eval_prompts_per_batch=eval_prompts_per_batch, seeds=self.seeds)  # the module's too
        check_int("RolloutDataModule.max_staleness", max_staleness, 0)
        require(sampler_process is None or isinstance(sampler_process, SamplerPlacement), "RolloutDataModule."
                "sampler_process", sampler_process, allowed="null or {cpus: [...], cuda_devices: [...]}")
        self.supply = RolloutSupply(self.rollouts, max_staleness)
        self.max_staleness, self.sampler_process = max_staleness, sampler_process
        require(dynamic_sampling is None or isinstance(dynamic_sampling, DynamicSampling),
                "RolloutDataModule.dynamic_sampling", dynamic_sampling, allowed="null or max_rounds: <n>")
        self.dynamic_sampling = dynamic_sampling
        require(isinstance(allow_changed_prompts, bool), "RolloutDataModule.allow_changed_prompts",
                allow_changed_prompts, allowed="true or false")
        self.allow_changed_prompts = allow_changed_prompts
        require(isinstance(prompt, PromptFormat), "RolloutDataModule.prompt", prompt,
                allowed="{system: ..., examples: [...], max_tokens: ...}")
        self.prompt = prompt
        self.shuffle = shuffle
        self.trust_remote_code = trust_remote_code
        self.eval_sets = eval_sets or []
        self.tokenizer = None
        self.train_items: list[tuple[Prompt, tuple[int, ...]]] = []
        self.eval_items: list[list[tuple[Prompt, tuple[int, ...]]]] = []
        self.dropped_prompts = 0
        self._train_loader: PromptLoader | None = None

    def setup(self, stage: str | None = None) -> None:
        module = self.trainer.lightning_module if self.trainer is not None else None
        if stage == "fit" and module is not None:  # the run's settings against each other, before anything loads
            check_run(module, self, self.trainer)  # (Lightning sets the data module up before the module)
        if self.tokenizer is not None:
            return self._place_sampler()
        if not self.model:
            raise ValueError("RolloutDataModule needs the policy's model string (data.model, linked to model.model)")
        self.tokenizer = load_tokenizer(self.model, self.trust_remote_code)
        encode = partial(encode_prompts, self.tokenizer, form=self.prompt)
        self.train_items, self.dropped_prompts = encode(self.source.load(), what="training")
        reward = getattr(module, "reward", None)
        if stage in ("fit", None) and getattr(reward, "needs_answers", False):  # the module's published reward
            require_answers(self.training_prompts(), who=type(reward).__name__)
        self.eval_items = [encode(s.load(), what=f"evaluation set {s.name!r}")[0] for s in self.eval_sets]
        for items, eval_set in zip(self.eval_items, self.eval_sets):
            if not items:
                raise DataError(f"evaluation set {eval_set.name!r}: every prompt is longer than data.prompt.max_tokens="
                                f"{self.prompt.max_tokens}: raise it")
        rank, world = self._rank_and_world()
        prompts_per_step = self.rollouts.prompts_per_step
        if len(self.train_items) < prompts_per_step * world:
            raise DataError(f"{len(self.train_items)} usable prompts but prompts_per_step={prompts_per_step} on each "
                            f"of {world} ranks: add prompts or lower prompts_per_step")
        self.longest_prompt = max(len(ids) for items in (self.train_items, *self.eval_items) for _, ids in items)
        self.rollouts.setup(self.tokenizer, self.longest_prompt, evaluates=bool(self.eval_sets), rank=rank)
        self._place_sampler()

    def _place_sampler(self) -> None:
        if self.sampler_process is not None and self.supply.remote is None:  # this rank's own, when asked for
            self.supply.remote = fail_together("sampler process start", lambda: start_sampler(
                self.sampler_process, self.rollouts, self.model, self.trust_remote_code, self.longest_prompt,
                bool(self.eval_sets), self.trainer))

    def teardown(self, stage: str) -> None:
        self.supply.stop()

    def next_rollouts(self, request: RolloutRequest) -> RolloutBatch:
        """The rollouts of the loader's ``request``: sampled now with the weights the engine holds (the step's), or
        taken from the off-policy line (``max_staleness``)."""
        return self.supply.sample_training(request.prompts, request.prompt_ids, next_prompts=self._next_prompts)

    def further_rollouts(self, round: int) -> RolloutBatch:
        """The loader's next prompts, sampled with round ``round``'s seeds (dynamic sampling's further rounds)."""
        request = self._train_loader.take()
        return self.supply.sample_training(request.prompts, request.prompt_ids, round=round,
                                           next_prompts=self._next_prompts)

    def eval_rollouts(self, request: RolloutRequest) -> RolloutBatch:
        """An evaluation ``request``'s responses, sampled now with the current weights."""
        return self.supply.sample_evaluation(request.prompts, request.prompt_ids)

    def _next_prompts(self) -> tuple:
        """The loader's next prompts and their ids, taken outside its iteration: the off-policy line fills its first
        ``max_staleness`` places with them."""
        return (request := self._train_loader.take()).prompts, request.prompt_ids

    def hand_weights(self, policy, new: bool = True) -> float:
        """Give the engine ``policy``'s weights as the next version (``new``) or, unless it holds them, as the current
        one (before training, after a restore, before an evaluation); the seconds it took."""
        start = time.perf_counter()
        self.supply.push(policy, new)
        return time.perf_counter() - start

    def timings(self) -> dict[str, float]:  # this step's wait on a sampler process and its idle time, if one
        return self.supply.timings()

    def encode_question(self, question: str) -> tuple[int, ...]:
        """``question`` as the policy reads a training prompt (chat template, system prompt, examples), for a reward."""
        return tuple(self.prompt.render(self.tokenizer, question))

    def training_prompts(self) -> list[Prompt]:
        """Every training prompt this run can draw (after ``setup``), in the source's order."""
        return [p for p, _ in self.train_items]

    def _rank_and_world(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)

    def train_dataloader(self) -> PromptLoader:
        # Every step has P full groups (the last partial batch is dropped); the loader's position is
        # part of each checkpoint, so a resumed run sees the same next batches.
        if self._train_loader is None:
            rank, world = self._rank_and_world()
            self._train_loader = PromptLoader(self.train_items, self.rollouts.prompts_per_step,
                                              make_batch=self._request, shuffle=self.shuffle, seeds=self.seeds,
                                              rank=rank, world_size=world)
        return self._train_loader

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(items, batch_size=self.rollouts.eval_prompts_per_batch, shuffle=False,
                           collate_fn=partial(RolloutRequest.of, eval_set=eval_set))
                for items, eval_set in zip(self.eval_items, self.eval_sets)]

    test_dataloader = val_dataloader

    def _request(self, items: list[tuple[Prompt, tuple[int, ...]]]) -> RolloutRequest:
        return RolloutRequest.of(items, max_rounds=self.dynamic_sampling.max_rounds if self.dynamic_sampling else 1)

    def prompts_hash(self) -> str:  # the training prompts as the policy reads them, in the source's order
        return hashlib.sha256(repr([(p.id, ids) for p, ids in self.train_items]).encode()).hexdigest()[:16]

    def state_dict(self) -> dict:
        return {"rollouts": self.supply.state_dict(), "prompts": self.prompts_hash()}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("prompts")
        if saved is not None and saved != self.prompts_hash() and not self.allow_changed_prompts:
            raise DataError(f"data.train: the training prompts differ from those the checkpoint was trained on (hash "
                            f"{self.prompts_hash()}, saved {saved}): restore them, or set data.allow_changed_prompts")
        self.supply.load_state_dict(state["rollouts"])
