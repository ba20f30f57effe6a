"""What a reward may use of the run: one object, the same for every reward, given to its hooks and its call.

The trainer fills it in (``evolrl/training/reward_hooks.py``): the run's directory, ranks and seeds before anything loads; the
policy and the step as training goes; the policy signal for each call of a reward that reads the policy. A reward
reaches the run's engine only through it (:meth:`RewardContext.generate`, :meth:`RewardContext.encode`), so its extra
texts (a teacher's responses, paraphrases, a measuring pass) are sampled by the engine that samples the step, with
seeds from the run's seed (:meth:`RewardContext.seed`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolrl.settings import require
from evolrl.types import Prompt, ResponseGroup


@dataclass
class RewardContext:
    """The run as a reward sees it (module docstring). Every field has a default, so a test builds what it needs."""

    run_dir: Path = Path(".")
    """``trainer.default_root_dir``: where a reward keeps files of its own (a pass's progress)."""
    seed: int = 0
    """The run's seed (``data.seed``); :meth:`seed_for` derives a reward's streams from it."""
    rank: int = 0
    world_size: int = 1
    step: int = 0
    """The training step (0-based): the one about to run in :meth:`Reward.before_step` and in the call."""
    call: int = 0
    """The call's number within the step (0-based; dynamic sampling calls once per round): with :attr:`step`, the key
    of a call's own seeds (:meth:`seed_for`)."""
    total_steps: int = 1
    """The run's training steps (for a schedule)."""
    policy: Any = None
    """The step's :class:`~evolrl.rewards.PolicySignal` over the trained responses, for a reward with
    ``needs_policy``; ``None`` otherwise."""
    model: Any = None
    """The policy being trained (a ``torch.nn.Module``), once built: what a teacher averages."""
    sampler: Any = None
    """The run's rollout side where it samples in this process (the data module's ``Rollouts`` and prompts); ``None``
    for recorded rollouts or a sampler process."""
    tokenizer: Any = None
    """The policy's tokenizer once the data module is set up (from :meth:`Reward.start` on): what turns a group's
    ``response_ids`` into text token by token."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The run's settings a reward may be checked against: ``max_staleness``, ``sampler_process``, ``sharded``
    (bool), ``overlong`` (the shaping object or ``None``), ``engine`` (its class name), ``sampler_logprobs`` (whether
    it reports each sampled token's log-prob), ``vote_samples`` (V); ``None`` where the run does not sample."""
    say: Callable[[str], None] = print
    """Rank 0's lines to the user (a no-op elsewhere)."""
    stop_point: Callable[[str], None] = lambda what: None
    """Call between units of long work outside a step (``what``: what is under way): on SIGTERM the run exits there."""

    # ---- sampling extra texts through the run's engine -----------------------------------------------------------
    def require_sampler(self, who: str, what: str) -> None:
        """A SettingError unless this run samples in this process (``who`` samples ``what`` through its engine)."""
        require(self.sampler is not None, "data", "recorded rollouts",
                allowed=f"a data module that samples (evolrl.data.RolloutDataModule): {who}: {what} through the "
                "run's engine")
        placement = self.settings.get("sampler_process")
        require(placement is None, "data.sampler_process", placement,
                allowed=f"null with {who}: {what} through the engine in the trainer's process")

    @property
    def sampling(self):
        """The run's training sampling (``evolrl.rollout.Sampling``)."""
        return self.sampler.rollouts.sampling

    @property
    def vote_samples(self) -> int:
        return self.sampler.rollouts.vote_samples

    @property
    def training_prompts(self) -> list[tuple[Prompt, tuple[int, ...]]]:
        """Every training prompt and its token ids, in the source's order."""
        return self.sampler.train_items

    def encode(self, question: str) -> tuple[int, ...]:
        """``question`` as the policy reads a training prompt: the run's chat template, system prompt and examples."""
        return self.sampler.encode_question(question)

    def generate(self, prompts: Sequence[Prompt], prompt_ids: Sequence[Sequence[int]], n: int, seed: int,
                 sampling=None) -> list[ResponseGroup]:
        """``n`` responses per prompt from the weights the engine holds, at the run's sampling unless ``sampling``."""
        rollouts = self.sampler.rollouts
        return rollouts.engine.generate(prompts, prompt_ids, sampling=sampling or rollouts.sampling, n=n, seed=seed)

    def seed_for(self, *key: object) -> int:
        """A 62-bit seed for ``key`` on this rank, from the run's seed: the same on a resumed run."""
        text = ":".join(map(str, ("reward", self.seed, self.rank, *key)))
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2
