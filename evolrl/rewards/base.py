"""The reward interface: what a reward declares, the hooks of a reward with state, and its one call.

A reward maps a :class:`~evolrl.types.RolloutBatch` (``P`` prompts x ``V`` responses) to a
:class:`~evolrl.types.RewardOutput`: ``[P, V]`` rewards plus named components. Subclass :class:`Reward` and select it
by ``class_path`` in a config to plug in another one (rewards that read answers start from
:class:`~evolrl.rewards.answer_sheet.AnswerReward`).

A reward with state, or one that samples more than the step's responses, needs nothing else: it declares what it
uses (the class attributes below), and the trainer calls its hooks at fixed points of every run
(``evolrl/training/reward_hooks.py``), each with the run's :class:`~evolrl.rewards.context.RewardContext`:

* :meth:`Reward.check` when ``fit`` starts, before any model loads: a SettingError for what it cannot run with;
* :meth:`Reward.start` before the first step of this start (a resumed run too, after its state was loaded);
* :meth:`Reward.before_step` before each step's scoring, returning numbers logged as ``train/<name>``;
* ``reward(batch, context)`` for the step's rollouts (once per sampling round with dynamic sampling); a reward that
  reads nothing of the run may define its call on the batch alone (:func:`call_reward`);
* :meth:`Reward.state_dict` into every checkpoint, :meth:`Reward.load_state_dict` out of it, before :meth:`start`.

``docs/method.md`` ("Writing a reward") walks through one written outside the package.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from evolrl.rewards.context import RewardContext
from evolrl.settings import require
from evolrl.types import RewardOutput, RolloutBatch


class Reward(ABC):
    """Scores every response of a rollout batch."""

    needs_answers = False
    """Whether it reads each prompt's ground truth: then ``fit`` checks every training prompt for one before the
    first step (``RolloutDataModule.setup``), where a check per batch meets a bad row only when the shuffle does."""

    needs_policy = False
    """Whether it reads the policy: then each call's ``context.policy`` is the step's
    :class:`~evolrl.rewards.PolicySignal` (``evolrl.rewards.policy_signal``)."""

    samples = False
    """Whether it samples texts of its own through ``context.generate`` (a teacher, paraphrases, a measuring pass):
    then ``fit`` refuses a run whose engine is not in the trainer's process."""

    keeps_state = False
    """Whether it keeps state between steps that checkpoints must carry (:meth:`state_dict`)."""

    components: Mapping[str, str] = {}
    """The named ``[P, V]`` parts of its outputs, name -> what each holds. Its outputs know only these names
    (:class:`~evolrl.types.Components`), so reading a misspelt one raises instead of reading as absent."""

    @abstractmethod
    def __call__(self, batch: RolloutBatch, context: RewardContext | None = None) -> RewardOutput:
        """Rewards ``[P, V]`` and their components for ``batch``."""

    def advantages(self, output: RewardOutput, trained: Tensor, advantages_of: Callable[[Tensor], Tensor]) -> Tensor:
        """``[P, G]`` advantages of the trained responses (``trained``: their ``[P, G]`` indices into the V): by
        default ``advantages_of`` (``model.advantages``) of their rewards, one GRPO group per prompt. A reward whose
        objective is not that (RESTRAIN's weighted sum over pseudo-labels) overrides this."""
        return advantages_of(output.rewards.gather(1, trained))

    # ---- the hooks of a reward with state -----------------------------------------------------------------------
    def check(self, context: RewardContext) -> None:
        """A SettingError naming the setting this reward cannot run with; called before any model loads. The
        default checks what the declarations need; an override calls it too."""
        name = type(self).__name__
        if self.samples:
            context.require_sampler(name, "it samples texts of its own")
        overlong = context.settings.get("overlong")
        if overlong is not None and not overlong.masks():
            require(type(self).advantages is Reward.advantages, "model.overlong", type(overlong).__name__,
                    allowed=f"null or evolrl.algorithms.OverlongMask with {name}, whose advantages are not its "
                    "rewards' (a penalty on the rewards would not reach them)")

    def start(self, context: RewardContext) -> None:
        """Before the first step of this start, the policy built and any checkpoint loaded (``context.model``)."""

    def before_step(self, context: RewardContext) -> dict[str, float]:
        """Before the step ``context.step`` is scored; numbers to log as ``train/<name>``."""
        return {}

    def timings(self) -> dict[str, float]:
        """Seconds this step spent on its own work, logged as ``time/<name>``."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What checkpoints carry; keys of its own, beside the module's (plain values and tensors only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The checkpoint's ``evolrl`` state, this reward's keys among it; called before :meth:`start`."""


def call_reward(reward: Reward, batch: RolloutBatch, context: RewardContext) -> RewardOutput:
    """``reward(batch, context)``; a reward whose call takes the batch alone (it reads nothing of the run) is called
    with the batch alone, so a stateless reward need not name a context it never reads."""
    parameters = inspect.signature(reward.__call__).parameters.values()
    takes = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)
    if takes >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return reward(batch, context)
    return reward(batch)
