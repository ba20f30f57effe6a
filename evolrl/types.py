"""The few records that flow through a training step, and the sampler they come from.

All are frozen and complete when built. The group axis is explicit: a :class:`RolloutBatch` holds ``P`` prompts,
each with a :class:`ResponseGroup` of ``V`` responses; per-response tensors are ``[P, V]``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Prompt:
    """One unlabeled problem."""

    id: str
    """Stable identifier (row id or index in the source file)."""
    question: str
    """The problem text, shown to the model as the user message."""
    answer: str | None = None
    """Ground truth when the source has it: for metrics and the RLVR baseline only."""
    source: str | None = None
    """Where the prompt came from (file or dataset name), for error messages and logs."""
    row: int | None = None
    """Its position among the source's rows (0-based), for error messages; ``None`` for generated prompts."""


def unanswered(prompts: Sequence[Prompt], shown: int = 5) -> str | None:
    """How many of ``prompts`` have no ground-truth answer, their sources and first ``shown`` rows; ``None``: all do."""
    missing = [p for p in prompts if p.answer is None]
    if not missing:
        return None
    sources = ", ".join(dict.fromkeys(p.source or "an unnamed source" for p in missing))
    first = ", ".join(f"row {p.row} (id {p.id!r})" if p.row is not None else f"id {p.id!r}" for p in missing[:shown])
    return f"{len(missing)} of {len(prompts)} prompts have no answer, in {sources} (first: {first})"


@dataclass(frozen=True)
class ResponseGroup:
    """The ``V`` responses sampled for one prompt."""

    prompt: Prompt
    texts: tuple[str, ...]
    """Decoded responses, ``[V]``."""
    truncated: tuple[bool, ...] | None = None
    """Whether each response hit the token limit, ``[V]``; ``None`` when unknown."""
    prompt_ids: tuple[int, ...] = ()
    """The rendered prompt's token ids (empty when the group was built from text only)."""
    response_ids: tuple[tuple[int, ...], ...] = ()
    """Sampled token ids per response, ``[V][len]``, ending with the stop token unless truncated."""
    sampler_logprobs: tuple[tuple[float, ...], ...] = ()
    """The sampler's log-prob of each sampled token, ``[V][len]``, when the engine reports it (mismatch correction)."""

    def __post_init__(self) -> None:
        if not self.texts:
            raise ValueError(f"prompt {self.prompt.id!r}: a response group needs at least one response")
        for name in ("truncated", "response_ids", "sampler_logprobs"):
            value = getattr(self, name)
            if value and len(value) != len(self.texts):
                raise ValueError(f"prompt {self.prompt.id!r}: {len(value)} {name} for {len(self.texts)} responses")


@dataclass(frozen=True)
class RolloutBatch:
    """``P`` response groups of equal size ``V``: one training step's rollouts."""

    groups: tuple[ResponseGroup, ...]
    weights_version: int | None = None
    """Version of the policy weights the responses were sampled with (see ``RolloutEngine.version``)."""
    trained: torch.Tensor | None = None
    """``[P, G]`` indices of the responses to train on: a reward-independent subset of the ``V``."""
    temperature: float | None = None
    """The sampling temperature, at which the policy loss scores the tokens (``None``: unknown)."""
    max_new_tokens: int | None = None
    """The response budget it was sampled with (overlong shaping, Dr. GRPO's normalizer; ``None``: unknown)."""

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a rollout batch needs at least one response group")
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        sizes = {len(g.texts) for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(f"all response groups must have the same size, got sizes {sorted(sizes)}")
        if self.trained is not None and (self.trained.dim() != 2 or self.trained.shape[0] != len(self.groups)):
            raise ValueError(f"trained must be [P, G] with P = {len(self.groups)}, got {tuple(self.trained.shape)}")

    def to(self, *args, **kwargs) -> RolloutBatch:
        """Itself: Lightning moves a batch with ``.to(device)``; a rollout batch holds no tensors to move there."""
        return self

    @property
    def num_prompts(self) -> int:  # P
        return len(self.groups)

    @property
    def group_size(self) -> int:  # V
        return len(self.groups[0].texts)

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return tuple(g.prompt for g in self.groups)

    @property
    def texts(self) -> tuple[tuple[str, ...], ...]:  # [P][V]
        return tuple(g.texts for g in self.groups)

    def truncated(self) -> torch.Tensor | None:
        """``[P, V]`` bool, or ``None`` if any group lacks truncation flags."""
        if any(g.truncated is None for g in self.groups):
            return None
        return torch.tensor([g.truncated for g in self.groups], dtype=torch.bool)


@runtime_checkable
class Sampler(Protocol):
    """The training step's one way to the rollout side (``evolrl.data.RolloutDataModule``; when each call comes:
    ``evolrl/rollout/sampler.py``). A data module of recorded rollouts is none: its batches are trained as they are."""

    max_staleness: int  # how many weight versions a trained batch may lag (0: sampled with the step's own weights)

    def next_rollouts(self, request: Any) -> RolloutBatch:
        """The rollouts of the loader's batch ``request`` (prompts, no responses yet), sampled for this step."""

    def further_rollouts(self, round: int) -> RolloutBatch:
        """The loader's next prompts, sampled with round ``round``'s seeds (dynamic sampling's further rounds)."""

    def eval_rollouts(self, request: Any) -> RolloutBatch:
        """An evaluation batch ``request``'s responses, sampled with the current weights."""

    def hand_weights(self, policy: Any, new: bool = True) -> float:
        """``policy``'s weights as the next version (``new``) or as the current one; the seconds it took."""

    def timings(self) -> dict[str, float]: ...  # seconds this step waited on the sampler, logged as ``time/*``


class Components(Mapping[str, torch.Tensor]):
    """A reward's named ``[P, V]`` tensors, read-only. It knows the names its reward declares (``Reward.components``;
    ``names=None``: those of ``values``): reading or testing (``in``) another name raises a KeyError, so a misspelt
    name never reads as absent, while a known name may be absent (a part the reward produces only in some settings)."""

    def __init__(self, values: Mapping[str, torch.Tensor], names: Collection[str] | None = None) -> None:
        self.names: tuple[str, ...] = tuple(values if names is None else names)
        self._values = {self._known(name): value for name, value in values.items()}

    def _known(self, name: Any) -> Any:
        if name not in self.names:
            raise KeyError(f"{name!r} is not a component its reward declares (Reward.components): "
                           f"{', '.join(self.names) or 'none'}")
        return name

    def view(self, names: Collection[str]) -> Components:
        """These components as a reader of any reward sees them: it knows ``names``, those produced are present."""
        return Components({name: self._values[name] for name in names if name in self._values}, names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._known(name) not in self._values:
            raise KeyError(f"this reward output has no component {name!r}; it has {', '.join(self._values) or 'none'}")
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return self._known(name) in self._values

    def get(self, name: str, default: Any = None) -> Any:
        return self._values.get(self._known(name), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Components({', '.join(self._values)})"


@dataclass(frozen=True)
class RewardOutput:
    """Rewards for a rollout batch plus the named parts they were built from."""

    rewards: torch.Tensor
    """``[P, V]`` float32 scalar reward per response."""
    answers: tuple[tuple[str | None, ...], ...]
    """Extracted final answer per response, ``[P][V]``; ``None`` when there is none."""
    labels: tuple[str | None, ...]
    """Per prompt: the majority label (or the ground truth for a verifier), ``[P]``."""
    components: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Named ``[P, V]`` tensors as :class:`Components` (a reward passes its declared names; a plain dict: its own)."""

    def __post_init__(self) -> None:
        if self.rewards.dim() != 2:
            raise ValueError(f"rewards must be [P, V], got shape {tuple(self.rewards.shape)}")
        shape = tuple(self.rewards.shape)
        if len(self.answers) != shape[0] or any(len(a) != shape[1] for a in self.answers):
            raise ValueError(f"answers must be [P][V] = {list(shape)}")
        if len(self.labels) != shape[0]:
            raise ValueError(f"labels must have P = {shape[0]} entries, got {len(self.labels)}")
        for name, value in self.components.items():
            if tuple(value.shape) != shape:
                raise ValueError(f"component {name!r} has shape {tuple(value.shape)}, expected {list(shape)}")
        if not isinstance(self.components, Components):
            object.__setattr__(self, "components", Components(self.components))


@dataclass(frozen=True, eq=False)
class StepOutput(Mapping[str, Any]):
    """What ``EvolRLModule.training_step`` returns, and what callbacks see in ``on_train_batch_end``. A Mapping too
    (Lightning takes a training step's output as one): ``output["stats"]`` reads the field, an unknown key raises."""

    rollouts: RolloutBatch
    """The step's response groups (``[P][V]``) and the trained subset."""
    rewards: RewardOutput
    """Rewards ``[P, V]`` and their components."""
    stats: Mapping[str, float]
    """The update's numbers (``loss``, ``pg_loss``, ``entropy``, ``kl``, ``grad_norm``...), logged under ``train/``."""
    timing: Mapping[str, float]
    """Seconds: ``step``, ``sample``, ``reward``, ``update``."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:
            raise KeyError(f"{key!r} is not part of a step output: {', '.join(self.__dataclass_fields__)}")
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(f.name for f in fields(self))

    def __len__(self) -> int:
        return len(fields(self))

    def copy(self) -> StepOutput:
        """Itself (frozen): Lightning copies a step's output before handing it to the callbacks."""
        return self


@dataclass(frozen=True)
class EvalOutput:
    """What ``EvolRLModule.validation_step`` / ``test_step`` return: one batch of graded evaluation samples."""

    dataset: str
    """The evaluation set's name."""
    answers: Sequence[Sequence[str | None]]
    """Extracted answers, ``[problems][n]``."""
    correct: Sequence[Sequence[bool]]
    """Whether each answer is right, ``[problems][n]``."""
    rollouts: RolloutBatch
    """The sampled groups."""
