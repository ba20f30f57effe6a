"""Label-free training diagnostics (docs/method.md, section 3), from one step's :class:`RewardOutput`.

Everything here is computed without labels. When the ground truth happens to be
known it is used for two extra numbers only: ``label_accuracy`` (is the majority
label right?) and ``reward_accuracy`` (does "agrees with the majority" match
"is correct", response by response?).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from evolrl.rewards.equivalence import answers_equivalent
from evolrl.types import RewardOutput

ZERO_VARIANCE_ATOL = 1e-8

READS = ("valid", "majority", "answer_class", "trailing", "novelty", "novelty_spread", "gated", "penalized",
         "label_weight", "prompt_weight", "teacher_share", "reframed_share", "subgroup_size")
"""The components the diagnostics read, from whichever reward declares them (the answer-reading rewards all declare
the first four)."""


def label_free_diagnostics(
    output: RewardOutput,
    truths: Sequence[str | None] | None = None,
    truncated: torch.Tensor | None = None,
) -> dict[str, float]:
    """Scalar diagnostics of one step.

    Args:
        output: Rewards and components of the step; uses ``valid``, ``majority``, ``answer_class``, ``novelty``,
            ``novelty_spread`` and ``trailing`` where present. Rewards that are NaN (responses a reward did not
            score) are left out of the reward statistics.
        truths: Ground-truth answer per prompt, ``None`` where unknown.
        truncated: ``[P, V]`` bool, responses that hit the token limit.
    """
    rewards = output.rewards.float()
    parts = output.components.view(READS)  # knows READS only: a reward's other names, or a misspelt one, raise
    # A reward that reads the policy scores only the trained responses; the others are NaN (not scored).
    scored = ~rewards.isnan()
    group_mean = rewards.nanmean(dim=1, keepdim=True)
    group_var = ((rewards - group_mean) ** 2).nanmean(dim=1)
    stats = {
        "reward_mean": rewards[scored].mean().item(),
        "reward_std": rewards[scored].std(unbiased=False).item() if scored.any() else math.nan,  # no torch warning
        "zero_variance_groups": (group_var.sqrt() <= ZERO_VARIANCE_ATOL).float().mean().item(),
    }
    if "valid" in parts:
        stats["valid_rate"] = parts["valid"].float().mean().item()
    if "majority" in parts:
        stats["majority_ratio"] = parts["majority"].float().mean().item()
    if "answer_class" in parts:
        classes = parts["answer_class"]
        stats["distinct_answers"] = sum(len(set(row) - {-1}) for row in classes.tolist()) / classes.shape[0]
    if "trailing" in parts:  # text after the final answer, which whole-response novelty can pay for
        stats["trailing_fraction"] = parts["trailing"].float().mean().item()
    if "novelty" in parts and torch.isfinite(parts["novelty"]).any():
        novelty = parts["novelty"]
        stats["novelty_mean"] = novelty[torch.isfinite(novelty)].mean().item()
    if "novelty_spread" in parts and torch.isfinite(parts["novelty_spread"]).any():  # before min-max scaling
        spread = parts["novelty_spread"]
        stats["novelty_spread_mean"] = spread[torch.isfinite(spread)].mean().item()
    if "gated" in parts:  # a consensus gate's groups without a label
        stats["gated_groups"] = parts["gated"].any(dim=1).float().mean().item()
    if "penalized" in parts:  # RESTRAIN's groups under min_majority
        stats["penalized_groups"] = parts["penalized"].any(dim=1).float().mean().item()
    # per prompt: RESTRAIN's u, Co-rewarding's teacher vote, Self-Harmony's rewrite agreeing with the label, SCOPE's
    # subgroup size
    for name in ("prompt_weight", "teacher_share", "reframed_share", "subgroup_size"):
        if name in parts:
            stats[f"{name}_mean"] = parts[name][:, 0].float().mean().item()
    if "label_weight" in parts and "answer_class" in parts and (parts["answer_class"] >= 0).any():
        stats["label_weight_mean"] = parts["label_weight"][parts["answer_class"] >= 0].float().mean().item()
    if truncated is not None:
        stats["truncation_rate"] = truncated.float().mean().item()
    known = [p for p, t in enumerate(truths or ()) if t is not None]
    if known and "majority" in parts:
        stats["label_accuracy"] = sum(answers_equivalent(output.labels[p], truths[p]) for p in known) / len(known)
        correct = torch.tensor([[answers_equivalent(a, truths[p]) for a in output.answers[p]] for p in known])
        stats["reward_accuracy"] = (parts["majority"][known] == correct).float().mean().item()
    return stats
