"""Scoring a training step's rollouts: the reward of every response, then the trained sequences with advantages.

Every reward is called the same way, ``reward(rollouts, context)`` (``evolrl/rewards/base.py``). For a reward that
reads the policy (``reward.needs_policy``: self-certainty, token entropy) the call's context holds one no-grad pass of
the policy over the trained sequences (the ``policy_pass`` function, ``GRPOUpdate.policy_pass``), whose log-probs the
sequences then carry as the update's old log-probs (``Sequences.old_logprobs``); for any other no pass is made here.

Overlong shaping (``model.overlong``) acts on the rewards before the advantages and on the loss mask after them; its
budget against the sampling's is ``evolrl.run_check``'s. Dynamic sampling (:func:`score_rounds`) scores round after
round of prompts and keeps the groups whose trained rewards disagree, as many on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from evolrl.algorithms import GroupAdvantages, Overlong, agreeing_groups
from evolrl.logprobs import Sequences, trained_sequences
from evolrl.rewards import Reward, RewardContext
from evolrl.rewards.base import call_reward
from evolrl.rewards.policy_signal import PolicySignal
from evolrl.training.run_checks import check_rewards
from evolrl.training.update import PolicyPass
from evolrl.types import Components, RewardOutput, RolloutBatch


@dataclass(frozen=True)
class Scored:
    """A scored step: rewards of all V responses, the trained G as sequences with their advantages."""

    rewards: RewardOutput
    """``[P, V]``."""
    advantages: torch.Tensor
    """``[P, G]``, of the trained responses."""
    seqs: Sequences
    """The trained responses, on the policy's device, their advantages set (and their old log-probs, where a reward
    read the policy)."""
    rollouts: RolloutBatch
    """The groups scored (with dynamic sampling: those kept, from every round)."""
    stats: dict[str, float]
    """What overlong shaping and dynamic sampling did (``overlong/*``, ``dynamic_sampling/*``)."""

    def response_length(self) -> float:
        """The trained responses' mean length in tokens (whether or not the loss masks them)."""
        picks = self.rollouts.trained.tolist()
        lengths = [len(g.response_ids[v]) for g, rows in zip(self.rollouts.groups, picks) for v in rows]
        return sum(lengths) / len(lengths)


def fresh(rollouts: RolloutBatch, step: int, max_staleness: int = 0) -> RolloutBatch:
    """``rollouts``, checked fresh enough to train at ``step``: refused if sampled with weights more than
    ``max_staleness`` versions older than the policy's at ``step`` (or newer), or if they do not say at which
    temperature."""
    version = rollouts.weights_version
    if version is not None and not step - max_staleness <= version <= step:
        raise RuntimeError(f"stale rollouts: sampled with weights version {version}, but the policy is at version "
                           f"{step} (one version per training step) and data.max_staleness={max_staleness}")
    if rollouts.temperature is None:
        raise ValueError("the rollout batch does not say at which temperature it was sampled "
                         "(RolloutBatch.temperature): the loss takes its log-probs under that temperature")
    return rollouts


def lag(rollouts: RolloutBatch, step: int) -> float:
    """How many weight versions ``rollouts`` are behind the policy at ``step``: 0 on-policy, up to ``max_staleness``
    off-policy (0 where unknown); logged as ``train/lag``."""
    return float(step - rollouts.weights_version) if rollouts.weights_version is not None else 0.0


def fewest(strategy, device: torch.device, count: int) -> int:
    """The smallest ``count`` over the ranks of ``strategy`` (a collective): dynamic sampling keeps as many groups,
    and samples as many rounds, on every rank."""
    return int(strategy.reduce(torch.tensor(count, device=device), reduce_op="min").item())


PAD_ID = 0
"""Right-padding positions are masked out of attention and loss, so their token id is never read: any id serves."""


@dataclass(frozen=True)
class Scoring:
    """What scores a step: the reward, the advantages, the overlong shaping, and the policy pass a reward may read."""

    reward: Reward
    advantages_of: GroupAdvantages
    overlong: Overlong | None
    device: torch.device
    policy_pass: Callable[[Sequences, float], PolicyPass]
    vocabulary: int
    """The policy's vocabulary size (for a reward that reads the policy)."""
    step: int = 0
    """The training step, for the error a non-finite reward stops the run with."""
    context: RewardContext = field(default_factory=RewardContext)
    """What the reward may use of the run (its hooks' context); a call's gets the policy signal where it reads it."""

    def __call__(self, rollouts: RolloutBatch) -> Scored:
        """Rewards ``[P, V]`` (shaped), group advantages of the trained ``[P, G]`` and their sequences (scored under
        the temperature the rollouts were sampled at)."""
        seqs = trained_sequences(rollouts, torch.zeros(rollouts.trained.shape), PAD_ID).to(self.device)
        context = self.context
        if self.reward.needs_policy:  # its old log-probs spare the update a pass
            passed = self.policy_pass(seqs, rollouts.temperature)
            seqs = replace(seqs, old_logprobs=passed.logp)
            context = replace(context, policy=PolicySignal.from_tokens(
                rollouts.trained, seqs.response_mask, logp=passed.logp, entropy=passed.entropy,
                mean_logp=passed.mean_logp, vocabulary=self.vocabulary))
        rewards = call_reward(self.reward, rollouts, context)
        self.context.call += 1  # the step's next call (a further round) draws seeds of its own
        check_rewards(self.reward, rewards, rollouts.trained, self.step)
        rewards, stats = self.shaping(rollouts, rewards)
        advantages = self.reward.advantages(rewards, rollouts.trained, self.advantages_of)  # [P, G]
        seqs, masked = self.mask(rollouts, rewards,
                                 replace(seqs, advantages=advantages.reshape(-1).float().to(self.device)))
        return Scored(rewards, advantages, seqs=seqs, rollouts=rollouts, stats=stats | masked)

    def mask(self, rollouts: RolloutBatch, rewards: RewardOutput, seqs: Sequences
             ) -> tuple[Sequences, dict[str, float]]:
        """``seqs`` with the responses the reward leaves out (its ``left_out`` component: a consensus gate's masked
        groups) and the truncated ones (:class:`~evolrl.algorithms.OverlongMask`) out of the loss mask, and the share
        of the latter."""
        left_out, stats = _left_out(rewards), {}
        if self.overlong is not None and self.overlong.masks():
            truncated = _truncated(rollouts)
            left_out, stats = left_out | truncated, {"overlong/masked": truncated.gather(1, rollouts.trained)
                                                     .float().mean().item()}
        if not left_out.any():
            return seqs, stats
        left_out = left_out.gather(1, rollouts.trained).reshape(-1, 1).to(self.device)
        return replace(seqs, response_mask=seqs.response_mask & ~left_out), stats

    def shaping(self, rollouts: RolloutBatch, rewards: RewardOutput) -> tuple[RewardOutput, dict[str, float]]:
        """Reward shaping: the rewards with the overlong penalty added, and the share of responses it touched."""
        if self.overlong is None:
            return rewards, {}
        budget = rollouts.max_new_tokens
        if budget is None:
            raise ValueError("overlong shaping needs the rollout batch's max_new_tokens (RolloutBatch.max_new_tokens)")
        lengths = torch.tensor([[len(ids) for ids in g.response_ids] for g in rollouts.groups])
        penalty = self.overlong.penalty(lengths, _truncated(rollouts), budget)
        if penalty is None:
            return rewards, {}
        shaped = replace(rewards, rewards=rewards.rewards + penalty.to(rewards.rewards))
        return shaped, {"overlong/penalized": (penalty < 0).float().mean().item()}


def score(reward: Reward, advantages_of: GroupAdvantages, rollouts: RolloutBatch, device: torch.device,
          policy_pass: Callable[[Sequences, float], PolicyPass], vocabulary: int) -> Scored:
    """One batch scored without overlong shaping or dynamic sampling (:class:`Scoring`)."""
    return Scoring(reward, advantages_of, None, device, policy_pass, vocabulary)(rollouts)


def score_rounds(scoring: Scoring, first: RolloutBatch, max_rounds: int, further: Callable[[int], RolloutBatch],
                 fewest: Callable[[int], int]) -> Scored:
    """``first`` scored; with dynamic sampling (``max_rounds > 1``) its agreeing groups dropped and further rounds of
    prompts (``further(round)``: the sampler's next prompts' rollouts) scored until every rank has kept as many
    groups as ``first`` has, or the rounds are spent.

    ``fewest(n)`` is the smallest ``n`` over the ranks (the same calls on every rank, so no collective hangs); every
    rank then trains on that many groups, its first kept. Where no rank kept any, the step trains on ``first`` as it
    was sampled (its advantages zero: only the entropy and KL terms act), as it would without dynamic sampling.
    """
    scored = scoring(first)
    if max_rounds <= 1:
        return scored
    wanted, rounds, parts = first.num_prompts, 1, []

    def keep(part: Scored) -> int:
        trains = ~agreeing_groups(part.rewards.rewards.gather(1, part.rollouts.trained))
        rows = (trains & ~_left_out(part.rewards).all(dim=1)).nonzero().flatten().tolist()
        parts.append((part, rows))
        return len(rows)

    kept = keep(scored)
    while rounds < max_rounds and fewest(kept) < wanted:
        kept += keep(scoring(further(rounds)))
        rounds += 1
    trained = min(fewest(kept), wanted)
    penalized = [part.stats["overlong/penalized"] for part, _ in parts if "overlong/penalized" in part.stats]
    shaped = {"overlong/penalized": sum(penalized) / len(penalized)} if penalized else {}  # over every round
    stats = {"dynamic_sampling/rounds": float(rounds), "dynamic_sampling/kept_groups": float(trained),
             "dynamic_sampling/dropped_groups": float(rounds * wanted - kept)}
    if trained == 0:
        return replace(scored, stats=scored.stats | shaped | stats)
    picks, left = [], trained
    for part, rows in parts:
        picks.append((part, rows[:left]))
        left -= len(picks[-1][1])
    return _joined(scoring, [(p, r) for p, r in picks if r], shaped, stats)


def _joined(scoring: Scoring, picks: list[tuple[Scored, list[int]]], shaped: dict[str, float],
            stats: dict[str, float]) -> Scored:
    """The groups ``picks`` (each scored part's rows) as one scored step, in order; the sequences rebuilt (without
    the old log-probs of a pass a reward read: the update makes its own)."""
    groups = tuple(p.rollouts.groups[r] for p, rows in picks for r in rows)
    take = [torch.tensor(rows) for _, rows in picks]
    first = picks[0][0].rollouts
    rollouts = replace(first, groups=groups, trained=torch.cat([p.rollouts.trained[t] for (p, _), t in zip(picks, take)]))
    outputs = [p.rewards for p, _ in picks]
    names = outputs[0].components.names
    components = {name: torch.cat([o.components[name][t] for o, t in zip(outputs, take)])
                  for name in outputs[0].components}
    rewards = RewardOutput(torch.cat([o.rewards[t] for o, t in zip(outputs, take)]),
                           answers=tuple(o.answers[r] for o, (_, rows) in zip(outputs, picks) for r in rows),
                           labels=tuple(o.labels[r] for o, (_, rows) in zip(outputs, picks) for r in rows),
                           components=Components(components, names))
    advantages = torch.cat([p.advantages[t] for (p, _), t in zip(picks, take)])
    seqs, masked = scoring.mask(rollouts, rewards, trained_sequences(rollouts, advantages, PAD_ID).to(scoring.device))
    return Scored(rewards, advantages, seqs=seqs, rollouts=rollouts, stats=shaped | masked | stats)


def _left_out(rewards: RewardOutput) -> torch.Tensor:
    """``[P, V]`` bool: the responses the reward leaves out of the loss (declared ``left_out``), else none."""
    parts = rewards.components
    if "left_out" in getattr(parts, "names", parts) and "left_out" in parts:
        return parts["left_out"].bool()
    return torch.zeros(rewards.rewards.shape, dtype=torch.bool)


def _truncated(rollouts: RolloutBatch) -> torch.Tensor:
    truncated = rollouts.truncated()
    if truncated is None:
        raise ValueError("overlong shaping needs to know which responses were truncated; the rollout engine did not "
                         "say (ResponseGroup.truncated)")
    return truncated
