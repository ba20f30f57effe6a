"""The reward interface.

A reward maps a :class:`~evolrl.types.RolloutBatch` (``P`` prompts x ``V``
responses) to a :class:`~evolrl.types.RewardOutput`: ``[P, V]`` rewards plus
named components. Subclass :class:`Reward` and select it by ``class_path`` in a
config to plug in another one (rewards that read answers start from
:class:`~evolrl.rewards.answer_sheet.AnswerReward`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping

from torch import Tensor

from evolrl.types import RewardOutput, RolloutBatch


class Reward(ABC):
    """Scores every response of a rollout batch."""

    needs_answers = False
    """Whether it reads each prompt's ground truth: then ``fit`` checks every training prompt for one before the
    first step (``RolloutDataModule.setup``), where a check per batch meets a bad row only when the shuffle does."""

    components: Mapping[str, str] = {}
    """The named ``[P, V]`` parts of its outputs, name -> what each holds. Its outputs know only these names
    (:class:`~evolrl.types.Components`), so reading a misspelt one raises instead of reading as absent."""

    needs_policy = False
    """Whether the reward reads the policy: then the module calls it as ``reward(batch, policy=PolicySignal)``
    (``evolrl.rewards.policy_signal``)."""

    @abstractmethod
    def __call__(self, batch: RolloutBatch) -> RewardOutput:
        """Rewards ``[P, V]`` and their components for ``batch``."""

    def advantages(self, output: RewardOutput, trained: Tensor, advantages_of: Callable[[Tensor], Tensor]) -> Tensor:
        """``[P, G]`` advantages of the trained responses (``trained``: their ``[P, G]`` indices into the V): by
        default ``advantages_of`` (``model.advantages``) of their rewards, one GRPO group per prompt. A reward whose
        objective is not that (RESTRAIN's weighted sum over pseudo-labels) overrides this."""
        return advantages_of(output.rewards.gather(1, trained))
