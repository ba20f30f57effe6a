"""The few records that flow through a training step.

All are frozen and complete when built. The group axis is explicit: a
:class:`RolloutBatch` holds ``P`` prompts, each with a :class:`ResponseGroup` of
``V`` responses; per-response tensors are ``[P, V]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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
    """Which of ``prompts`` carry no ground-truth answer: how many, their sources and the first ``shown`` rows;
    ``None`` when all do."""
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
    """The sampler's log-prob of each sampled token, ``[V][len]``, when the engine reports it: the update's
    mismatch diagnostics and correction (``evolrl/algorithms/mismatch.py``); its old log-probs are the policy's own."""

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
    """The sampling temperature: the policy loss scores the tokens under ``softmax(logits / temperature)``, as they
    were drawn (training needs it; ``None``: unknown)."""

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
        """Itself: Lightning moves a batch with ``.to(device)``, and a rollout batch has nothing to move (token ids in
        tuples; the training step builds its tensors on its device)."""
        return self

    @property
    def num_prompts(self) -> int:
        """``P``."""
        return len(self.groups)

    @property
    def group_size(self) -> int:
        """``V``."""
        return len(self.groups[0].texts)

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return tuple(g.prompt for g in self.groups)

    @property
    def texts(self) -> tuple[tuple[str, ...], ...]:
        """Responses as ``[P][V]``."""
        return tuple(g.texts for g in self.groups)

    def truncated(self) -> torch.Tensor | None:
        """``[P, V]`` bool, or ``None`` if any group lacks truncation flags."""
        if any(g.truncated is None for g in self.groups):
            return None
        return torch.tensor([g.truncated for g in self.groups], dtype=torch.bool)


@runtime_checkable
class PromptProvider(Protocol):
    """A data module that can list its training prompts, so that checks over all of them run before the first step
    (``evolrl.data.RolloutDataModule``)."""

    def training_prompts(self) -> Sequence[Prompt]: ...


class RolloutSource(Protocol):
    """Rollouts sampled only when asked: what a data module yields when a batch fetched ahead of its training step
    would come from older weights (``evolrl.data.RolloutRequest``)."""

    def sample(self) -> RolloutBatch: ...


class EvalSource(RolloutSource, Protocol):
    """A validation/test batch: rollouts sampled when asked, and the evaluation set they are graded for (its ``name``
    and ``grader(text, answer) -> (answer, correct)``; ``evolrl.data.EvalSet``). ``None``: a training batch."""

    eval_set: Any


COMPONENTS: dict[str, str] = {
    "valid": "bool: the response's answer is valid (the reward's valid_rule)",
    "majority": "bool: its answer is equivalent to the group's majority label",
    "answer_class": "int: its answer's equivalence class in the group, in order of appearance (-1: no answer)",
    "trailing": "bool: a letter or digit follows its final answer (False without one)",
    "novelty": "float: EVOL-RL's novelty u (NaN where not embedded)",
    "correct": "bool: its answer is equivalent to the ground truth (a verifier)",
    "cluster_share": "float: the share of the group in its answer's cluster (semantic entropy)",
    "self_certainty": "float: the response's self-certainty under the policy (NaN where not scored)",
    "neg_entropy": "float: minus the response's mean token entropy under the policy (NaN where not scored)",
}
"""The names a reward's components may have, each with what it holds. A reward with a component of its own registers
it (:func:`register_component`) so that asking for a misspelt name fails instead of finding nothing."""


def register_component(name: str, meaning: str) -> None:
    """Allow ``name`` as a reward component (``meaning``: its dtype and what it holds)."""
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"a component name is an identifier, got {name!r}")
    COMPONENTS.setdefault(name, meaning)


def _known(name: str) -> None:
    if name not in COMPONENTS:
        raise KeyError(f"{name!r} is not a reward component: one of {', '.join(COMPONENTS)} "
                       "(a reward's own component is added with evolrl.types.register_component)")


class Components(Mapping[str, torch.Tensor]):
    """A reward's named ``[P, V]`` tensors, read-only. Every name is a registered one (:data:`COMPONENTS`): reading
    or testing (``in``) an unknown name raises a KeyError, so a misspelt name never reads as absent."""

    def __init__(self, values: Mapping[str, torch.Tensor]) -> None:
        for name in values:
            _known(name)
        self._values = dict(values)

    def __getitem__(self, name: str) -> torch.Tensor:
        _known(name)
        if name not in self._values:
            raise KeyError(f"this reward output has no component {name!r}; it has {', '.join(self._values) or 'none'}")
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        _known(name)
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        _known(name)
        return self._values.get(name, default)

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
    """Named ``[P, V]`` tensors (:class:`Components`: names from :data:`COMPONENTS`), e.g. ``valid``, ``majority``,
    ``novelty``, ``answer_class``."""

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
    """The update's numbers (``loss``, ``pg_loss``, ``entropy``, ``kl``, clip fractions, ``grad_norm``, ``lr``,
    ``mismatch/*``...), as logged under ``train/``."""
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
