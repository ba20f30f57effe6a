"""RESTRAIN (Yu et al., ICLR 2026, arXiv 2510.02172): every answer of a group is a pseudo-label, weighted by its vote.

Three parts, each a setting that can be switched off (docs/method.md, "RESTRAIN", has the formulas and where this
differs from the paper):

* pseudo-label weighting: answer ``j`` with vote share ``f_j`` weighs ``w_j = g(f_j) / sum_l g(f_l)``,
  ``g(f) = exp(-(f - center)^2 / (2 sigma^2))``; the prompt's objective is ``sum_j w_j`` times the GRPO objective
  with ``j`` as the label. Off: the majority alone (TTRL).
* negative rollout penalization: a group whose majority holds fewer than ``min_majority`` responses gets no reward
  and every advantage ``-delta``.
* prompt-level weighting: each prompt's advantages times ``u_x``, from the base model's own consistency on it,
  measured once before training (:class:`PromptWeights`, ``prompt_weights.py``).

The objective is a weighted sum of GRPO objectives, not one GRPO group of rewards, so the reward defines the
advantages (:meth:`RestrainReward.advantages`); summing advantages is the sum of the objectives while the clip is
inactive (each term's ratio is the same), which is where the update starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from evolrl.rewards.answer_rules import EVERY_ANSWER, AnswerRules
from evolrl.rewards.answer_sheet import AnswerSheet
from evolrl.rewards.consensus_gate import ConsensusGate
from evolrl.rewards.context import RewardContext
from evolrl.rewards.majority_vote_reward import MajorityVoteReward
from evolrl.rewards.restrain.prompt_weights import measure_shares
from evolrl.rewards.voting import class_counts, majority_class
from evolrl.settings import check_float, check_int, require
from evolrl.types import RewardOutput, RolloutBatch


@dataclass(frozen=True)
class PromptWeights:
    """RESTRAIN's prompt-level weights: the base model's majority share on each training prompt, measured before
    the first step and saved beside the run (``<trainer.default_root_dir>/restrain_prompt_weights.jsonl``)."""

    samples: int = 8
    """Responses per prompt sampled from the base model (at the training sampling settings) for its vote."""
    normalize: bool = True
    """Scale the weights to mean 1 over the training prompts, so the learning rate means what it does without."""

    def __post_init__(self) -> None:
        check_int("PromptWeights.samples", self.samples, 1)
        require(isinstance(self.normalize, bool), "PromptWeights.normalize", self.normalize, allowed="true or false")


class RestrainReward(MajorityVoteReward):
    """RESTRAIN's reward and advantages (module docstring).

    Args:
        answers: How answers are read; by default every response with an answer votes, as in TTRL.
        gate: When a group's majority may teach (:class:`~evolrl.rewards.ConsensusGate`); ``null``: always.
        label_weighting: Weigh every answer by ``g`` of its vote share; false: the majority label alone.
        center: ``g``'s center, the share weighed most; in [0, 1].
        sigma: ``g``'s width (> 0): small tends to the majority alone, large to equal weights.
        negative_penalty: Penalize the groups whose majority is smaller than ``min_majority``.
        min_majority: The majority count (kappa) below which a group is penalized.
        delta: The advantage every response of a penalized group gets, negated (> 0).
        prompt_weights: The prompt-level weights' pass (:class:`PromptWeights`); ``null``: every prompt weighs 1.
    """

    components = MappingProxyType({
        **MajorityVoteReward.components,
        "label_weight": "float: the weight w of its answer as a pseudo-label (0: no answer)",
        "penalized": "bool: its group's majority was below min_majority (negative rollout penalization)",
        "prompt_weight": "float: its prompt's weight u (1 without prompt weighting)",
    })

    def __init__(self, answers: AnswerRules = EVERY_ANSWER, gate: ConsensusGate | None = None,
                 label_weighting: bool = True, center: float = 1.0, sigma: float = 0.5, negative_penalty: bool = True,
                 min_majority: int = 3, delta: float = 0.5, prompt_weights: PromptWeights | None = None) -> None:
        super().__init__(answers, gate)
        for key, value in (("label_weighting", label_weighting), ("negative_penalty", negative_penalty)):
            require(isinstance(value, bool), f"RestrainReward.{key}", value, allowed="true or false")
        check_float("RestrainReward.center", center, 0.0, 1.0)
        check_float("RestrainReward.sigma", sigma, 0.0, low_open=True)
        check_int("RestrainReward.min_majority", min_majority, 1)
        check_float("RestrainReward.delta", delta, 0.0, low_open=True)
        require(prompt_weights is None or isinstance(prompt_weights, PromptWeights), "RestrainReward.prompt_weights",
                prompt_weights, allowed="null (every prompt weighs 1) or an evolrl.rewards.PromptWeights")
        self.label_weighting, self.center, self.sigma = label_weighting, center, sigma
        self.negative_penalty, self.min_majority, self.delta = negative_penalty, min_majority, delta
        self.prompt_weights = prompt_weights
        self.weights: dict[str, float] = {}
        """Prompt id -> u, once measured (:meth:`set_prompt_weights`)."""
        self.shares: dict[str, float] = {}
        """Prompt id -> the base model's majority share, the weights' source (checkpoints keep it)."""

    @property
    def samples(self) -> bool:  # the base model's pass samples the training prompts through the run's engine
        return self.prompt_weights is not None

    @property
    def keeps_state(self) -> bool:  # the measured shares
        return self.prompt_weights is not None

    def start(self, context: RewardContext) -> None:
        """The prompt weights by the base model's pass, unless a checkpoint brought them."""
        if self.prompt_weights is None or self.weights:
            return
        require(context.step == 0, "--ckpt_path", context.step,
                allowed="a checkpoint that holds RESTRAIN's prompt weights (its base-model pass needs the base "
                "model's weights, which a resumed policy no longer has)")
        self.set_prompt_weights(measure_shares(
            context.sampler, self.prompt_weights.samples, self.answers, context.run_dir, context.rank,
            context.world_size, stop_point=context.stop_point, say=context.say))

    def state_dict(self) -> dict[str, Any]:
        return {"prompt_shares": dict(self.shares)} if self.prompt_weights is not None and self.shares else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.prompt_weights is not None and "prompt_shares" in state:
            self.set_prompt_weights(state["prompt_shares"])

    def g(self, share: Tensor | float) -> Tensor:
        """The shaping of a vote share: ``exp(-(share - center)^2 / (2 sigma^2))``."""
        share = torch.as_tensor(share, dtype=torch.float32)
        return torch.exp(-((share - self.center) ** 2) / (2 * self.sigma**2))

    def set_prompt_weights(self, shares: Mapping[str, float]) -> None:
        """The prompt weights from the base model's majority share per prompt id: ``u = g(share)``, scaled to mean 1
        when ``normalize``; a share that is not a number in [0, 1] is a ValueError naming the prompt."""
        bad = next(((k, v) for k, v in shares.items() if not (isinstance(v, float) and 0.0 <= v <= 1.0)), None)
        if bad is not None:
            raise ValueError(f"RESTRAIN prompt weights: prompt {bad[0]!r} has majority share {bad[1]!r}, not a number "
                             "in [0, 1]; delete the weights file to measure them again")
        self.shares = dict(shares)
        weights = {k: float(self.g(v)) for k, v in shares.items()}
        scale = len(weights) / sum(weights.values()) if weights and self.prompt_weights.normalize else 1.0
        self.weights = {k: w * scale for k, w in weights.items()}

    def label_weights(self, classes: list[int]) -> dict[int, float]:
        """Class -> ``w``, for one group's answer classes over its V responses (-1: no answer)."""
        counts = class_counts(classes)
        if not counts:
            return {}
        if not self.label_weighting:  # the majority alone; ties to the first seen, as the vote
            return {majority_class(classes): 1.0}
        g = {c: float(self.g(n / len(classes))) for c, n in counts.items()}
        total = sum(g.values())
        return {c: v / total for c, v in g.items()}

    def score(self, batch: RolloutBatch, sheet: AnswerSheet) -> tuple[Tensor, dict[str, Tensor]]:
        classes = sheet.answer_class.tolist()
        weights = [self.label_weights(row) for row in classes]
        weight = torch.tensor([[w.get(c, 0.0) for c in row] for row, w in zip(classes, weights)])
        majority = torch.tensor([max(class_counts(row).values(), default=0) for row in classes])
        penalized = (majority < self.min_majority if self.negative_penalty else torch.zeros_like(majority, dtype=bool))
        if self.prompt_weights is not None:
            missing = [g.prompt.id for g in batch.groups if g.prompt.id not in self.weights]
            if missing:
                raise RuntimeError(f"RestrainReward: no prompt weight for prompt {missing[0]!r}; the weights are "
                                   "measured at fit's start over the training prompts (PromptWeights)")
        u = torch.tensor([self.weights.get(g.prompt.id, 1.0) for g in batch.groups])
        rows = penalized[:, None].expand_as(weight)
        return torch.where(rows, 0.0, weight), {"label_weight": weight, "penalized": rows,
                                                 "prompt_weight": u[:, None].expand_as(weight)}

    def advantages(self, output: RewardOutput, trained: Tensor, advantages_of: Callable[[Tensor], Tensor]) -> Tensor:
        """``u_x (sum_j w_j A_j)`` per trained response, ``A_j`` the GRPO advantages (``advantages_of``) with answer
        ``j`` as the label; ``-u_x delta`` in a penalized group; a group the gate turned negative: the GRPO advantages
        of its rewards."""
        parts = output.components
        classes = parts["answer_class"].gather(1, trained)
        gated = parts["gated"][:, 0] if "gated" in parts else torch.zeros(len(trained), dtype=torch.bool)
        out = torch.zeros(trained.shape)
        for p, row in enumerate(parts["answer_class"].tolist()):
            u = parts["prompt_weight"][p, 0].item()
            if gated[p]:
                out[p] = u * advantages_of(output.rewards[p : p + 1].gather(1, trained[p : p + 1]))[0]
            elif parts["penalized"][p, 0]:
                out[p] = -u * self.delta
            else:
                for c, w in self.label_weights(row).items():
                    out[p] += u * w * advantages_of((classes[p : p + 1] == c).float())[0]
        return out
