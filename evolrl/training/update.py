"""The policy update of one training step: GRPO loss, gradient accumulation, optimizer steps.

One training step = one rollout batch, split into mini-batches (one optimizer step each, in order, one PPO epoch) and
micro-batches (gradient accumulation). The loss normalizer is fixed per mini-batch before the micro-batch loop, so how
a mini-batch is split into micro-batches (a count, or a token budget: ``plan.py``) does not change the math; across
ranks it is the global count. Loss terms are summed on the device and read once. A micro-batch is right-padded rows or
one packed row (``evolrl.logprobs``). The passes without gradients (old log-probs, reference) are planned apart: over
the whole step, at ``Batching.no_grad_pass_multiple`` times a training pass's size (no activations kept).

When the engine reports its log-probs, every step also measures how far they are from the old log-probs
(``mismatch/*``, summed over micro-batches and ranks) and, with ``GRPOLoss.mismatch_correction``, weighs each
token's policy-gradient loss by an importance weight (``evolrl/algorithms/corrections.py``). The weights never change
the normalizer: a masked token counts in it with weight 0 (as in TRL), so the normalizer stays the global token
count fixed before the micro-batch loop, whatever is masked on which rank.

The loss's formula is ``loss.py``'s. :class:`GRPOUpdate` holds the settings and owns the micro-batch plan and the
forward pass; the policy, the reference, the sequences, the optimizer and the schedule are arguments, so it runs without
a Trainer (``tests/test_update.py``). What a step's sequences bring with them (the old log-probs of a pass a reward
read, the response budget a constant normalizer reads) travels on the :class:`~evolrl.logprobs.Sequences`, and the
step's loss terms add up in a :class:`StepTotals`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from evolrl.algorithms import MismatchCorrection, mismatch_summary
from evolrl.distributed import all_reduce, gathered_until_backward, sync_gradients, world_size
from evolrl.logprobs import Sequences, token_stats
from evolrl.training.batching import Batching
from evolrl.training.loss import GRPOLoss
from evolrl.training.plan import Plan, lockstep, micro_batch_plan, mini_batch_ranges, token_budget_plan
from evolrl.training.run_checks import too_many_skips


@dataclass(frozen=True)
class PolicyPass:
    """:meth:`GRPOUpdate.policy_pass`: the policy over a step's sequences without gradients, before the update; per
    token ``[N, T - 1]`` (0 where nothing is scored)."""

    logp: Tensor
    """The log-prob of each token: the update's old log-probs, once set as the sequences' ``old_logprobs``."""
    entropy: Tensor
    """The entropy of each token's distribution."""
    mean_logp: Tensor
    """The mean over the vocabulary of each token distribution's log-probs."""


class GRPOUpdate:
    """The GRPO loss (``loss.py``) over one step's sequences, one optimizer step per mini-batch.

    Args:
        loss: The loss settings.
        batching: Mini-batches, micro-batches and how a pass runs.
        max_grad_norm: Gradient-norm clip; a mini-batch whose norm is not finite is skipped and counted.
        max_consecutive_skips: Skipped optimizer steps in a row tolerated; one more raises ``TrainingStopped``.
        backward: How a pass's loss is differentiated: Lightning's ``manual_backward`` in a run (the module's).
    """

    def __init__(self, loss: GRPOLoss, batching: Batching, max_grad_norm: float, max_consecutive_skips: int = 3,
                 backward: Callable[[Tensor], None] = Tensor.backward) -> None:
        self.loss, self.batching, self.max_grad_norm = loss, batching, max_grad_norm
        self.max_consecutive_skips, self.backward = max_consecutive_skips, backward
        self.skipped_steps = self.skips_in_a_row = 0
        """Optimizer steps skipped (the gradient norm not finite) so far, and since the last applied one."""

    def plan(self, seqs: Sequences) -> Plan:
        """Rows of each micro-batch by mini-batch; with a token budget, as many micro-batches on every rank."""
        b = self.batching
        if b.max_tokens_per_micro_batch is None:  # the same on every rank: every rank has as many rows
            return micro_batch_plan(len(seqs), b.mini_batch_size, b.micro_batch_size)
        plan = token_budget_plan(seqs.host_layout().lengths.tolist(), b.mini_batch_size,
                                 budget=b.max_tokens_per_micro_batch, packed=b.packed)
        return lockstep(plan, seqs.input_ids.device)

    def optimizer_steps(self, sequences_per_step: int) -> int:
        """Optimizer steps (mini-batches) in one training step of ``sequences_per_step`` sequences."""
        return len(mini_batch_ranges(sequences_per_step, self.batching.mini_batch_size))

    def forward(self, model: nn.Module, seqs: Sequences, temperature: float, vocab_mean: bool = False,
                train: bool = False) -> tuple[Tensor, ...]:
        """``token_stats`` of ``model`` over ``seqs`` as the batching says (``train``: a training pass's)."""
        b = self.batching
        return token_stats(model, seqs, temperature, b.train_passes if train else b.passes, vocab_mean=vocab_mean)

    @staticmethod
    def micro_batch(seqs: Sequences, rows: list[int]) -> Sequences:
        """The rows of one micro-batch; none: a filler pass (another rank has one more micro-batch)."""
        return seqs.select(rows) if rows else Sequences.filler(seqs.input_ids.device, seqs.sampler_logprobs is not None)

    def no_grad_plan(self, seqs: Sequences, rows: list[int]) -> list[list[int]]:
        """The passes without gradients over ``rows``: as the training passes are cut, at ``no_grad_pass_multiple``
        times their size, across mini-batches (these passes run before any optimizer step); as many on every rank."""
        b = self.batching
        if not rows:
            return []
        if b.max_tokens_per_micro_batch is None:  # every rank has as many rows
            size = b.micro_batch_size * b.no_grad_pass_multiple
            return [rows[i : i + size] for i in range(0, len(rows), size)]
        lengths = seqs.host_layout().lengths[rows].tolist()
        (passes,) = token_budget_plan(lengths, mini_batch_size=len(rows), packed=b.packed,
                                      budget=b.max_tokens_per_micro_batch * b.no_grad_pass_multiple)
        (passes,) = lockstep([passes], seqs.input_ids.device)
        return [[rows[i] for i in micro] for micro in passes]

    @torch.no_grad()
    def no_grad_stats(self, model: nn.Module, seqs: Sequences, rows: list[int], temperature: float,
                      vocab_mean: bool = False) -> Tensor:
        """``model``'s per-token statistics over ``rows`` without gradients (:meth:`no_grad_plan`), stacked:
        ``[2 or 3, N, T - 1]`` (log-prob, entropy and with ``vocab_mean`` the vocabulary's mean log-prob), 0 in the
        other rows and where nothing is scored."""
        stats = None
        for micro in self.no_grad_plan(seqs, rows):
            part = self.micro_batch(seqs, micro)
            values = torch.stack(self.forward(model, part, temperature, vocab_mean=vocab_mean))
            if stats is None:  # in the pass's dtype (float64 models give float64 log-probs)
                stats = values.new_zeros(len(values), *seqs.response_mask.shape)
            if micro:
                stats[:, micro, : part.response_mask.shape[1]] = values
        return stats if stats is not None else torch.zeros(3 if vocab_mean else 2, *seqs.response_mask.shape,
                                                           device=seqs.input_ids.device)

    def policy_pass(self, policy: nn.Module, seqs: Sequences, temperature: float) -> PolicyPass:
        """The policy over ``seqs`` without gradients: per token ``[N, T - 1]`` the log-prob (the old log-probs of
        every mini-batch, set as ``seqs.old_logprobs``), the entropy and the vocabulary's mean log-prob (what a reward
        that reads the policy needs)."""
        return PolicyPass(*self.no_grad_stats(policy, seqs, list(range(len(seqs))), temperature, vocab_mean=True))

    def __call__(self, policy: nn.Module, reference: nn.Module | None, seqs: Sequences, temperature: float,
                 optimizer, scheduler) -> dict[str, float]:
        """Train on ``seqs``; the mean of each loss term over the mini-batches. Their ``old_logprobs``, where set
        (:meth:`policy_pass` before any change to the policy), are every mini-batch's old log-probs; their
        ``max_new_tokens`` is what a constant normalizer (Dr. GRPO) reads.

        Plan, then per mini-batch its passes (:meth:`train_pass`) and one optimizer step (:meth:`optimizer_step`).
        """
        if self.loss.mismatch_correction is not None and seqs.sampler_logprobs is None:
            raise ValueError(f"mismatch_correction={self.loss.mismatch_correction!r} needs the sampler's log-probs, "
                             "and the rollout engine reported none")
        ranks = world_size()  # data-parallel ranks, whose gradients are averaged
        hold = self.batching.holds_gathered(ranks)
        with gathered_until_backward(policy, hold), _synced_after(policy):
            plan = self.plan(seqs)
            minis = mini_batch_ranges(len(seqs), self.batching.mini_batch_size)
            # The reference first: the copy the policy's old log-probs' pass leaves held is then never alive beside
            # the reference's.
            with gathered_until_backward(reference, hold):
                ref_logp = None if reference is None else self.no_grad_stats(
                    reference, seqs, rows=list(range(len(seqs))), temperature=temperature)[0]
            # The first mini-batch's old log-probs are its own passes' (detached): the policy has not changed yet.
            given = seqs.old_logprobs is not None
            old_logp = seqs.old_logprobs if given else self.no_grad_stats(
                policy, seqs, rows=list(range(minis[0].stop, len(seqs))), temperature=temperature)[0]
            totals = StepTotals()
            for i, (minibatch, rows) in enumerate(zip(plan, minis)):
                # Fixed before the micro-batch loop: accumulation does not change the loss.
                mask = seqs.response_mask[rows.start : rows.stop]
                local = self.loss.aggregation.normalizer(mask, seqs.max_new_tokens)
                normalizer = (all_reduce(local.float()) / ranks).clamp(min=1e-30)  # none: a gated mini-batch
                for j, micro in enumerate(minibatch):
                    last = j == len(minibatch) - 1
                    sync_gradients(policy, last or self.batching.reduce_every_pass, hold=hold and not last)
                    part = self.micro_batch(seqs, micro)
                    terms, measured = self.train_pass(
                        policy, part, temperature=temperature, normalizer=normalizer,
                        old=_rows_of(old_logp, micro, part) if given or i > 0 else None,
                        ref=None if ref_logp is None else _rows_of(ref_logp, micro, part))
                    totals.add(terms, measured)
                totals.add({"grad_norm": self.optimizer_step(policy, optimizer, scheduler)})
            return totals.summary(len(plan), self.loss.mismatch_correction)

    def train_pass(self, policy: nn.Module, part: Sequences, temperature: float, old: Tensor | None,
                   ref: Tensor | None, normalizer: Tensor) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor] | None]:
        """One forward/backward pass: the loss terms (detached, aggregated with the mini-batch's ``normalizer``) and,
        when the engine reported log-probs, the pass's mismatch sums. ``old`` ``None``: the pass's own log-probs (the
        first mini-batch, before any step)."""
        logp, entropy = self.forward(policy, part, temperature, train=True)
        old = old if old is not None else logp.detach()
        weights, measured = self.loss.correct(old, part) if part.sampler_logprobs is not None else (None, None)
        loss, terms = self.loss(logp, entropy, old=old, ref=ref, advantages=part.advantages[:, None],
                                mask=part.response_mask, normalizer=normalizer, weights=weights,
                                compiled=self.batching.compile_blocks)
        self.backward(loss)
        return terms, measured

    def optimizer_step(self, policy: nn.Module, optimizer, scheduler) -> Tensor:
        """Clip the accumulated gradient and step; a mini-batch whose gradient norm is not finite is skipped and
        counted. ``optimizer.step()`` runs either way (its gradients dropped first, so nothing moves: Lightning counts
        its steps); ``scheduler.step()`` only after an applied one. The gradient norm, on the device."""
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), self.max_grad_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2
        applied = bool(torch.isfinite(grad_norm))  # the one host sync per optimizer step
        if not applied:
            optimizer.zero_grad(set_to_none=True)  # the step below then moves nothing
            self.skipped_steps += 1
        self.skips_in_a_row = 0 if applied else self.skips_in_a_row + 1
        if self.skips_in_a_row > self.max_consecutive_skips:  # every rank: the norm is the same on all of them
            raise too_many_skips(self.skips_in_a_row, self.max_consecutive_skips)
        optimizer.step()
        # Lightning's bf16-mixed runs the step in one autocast, whose cache keeps each weight's bf16 copy until it
        # exits, however the weight changed: the next mini-batch would train on the weights this step started from.
        torch.clear_autocast_cache()
        if applied:
            scheduler.step()
        optimizer.zero_grad()
        return grad_norm.detach().float()


@contextmanager
def _synced_after(policy: nn.Module) -> Iterator[None]:
    """FSDP2's defaults back (reduce and free after every backward) when the update ends, or fails."""
    try:
        yield
    finally:
        sync_gradients(policy, True)


def _rows_of(values: Tensor, rows: list[int], part: Sequences) -> Tensor:
    """``[N, T - 1]`` per-token ``values`` of a step, as a pass over ``part`` (its ``rows``) returns them: those rows,
    as wide as the part's; zeros for a filler."""
    return values[rows, : part.response_mask.shape[1]] if rows else values.new_zeros(part.response_mask.shape)


class StepTotals:
    """A training step's loss terms summed on the device and read once at the end (no sync per term), and its
    passes' mismatch sums, reduced over the ranks at the end (two all-reduces per step)."""

    def __init__(self) -> None:
        self.sums: dict[str, Tensor] = {}
        self.mismatch: list[tuple[Tensor, Tensor]] = []

    def add(self, terms: dict[str, Tensor], measured: tuple[Tensor, Tensor] | None = None) -> None:
        for name, value in terms.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        if measured is not None:
            self.mismatch.append(measured)

    def summary(self, mini_batches: int, correction: MismatchCorrection | None) -> dict[str, float]:
        """Each term's mean over the mini-batches; ``mismatch/*`` over all passes on all ranks."""
        stats = dict(zip(self.sums, torch.stack(list(self.sums.values())).div(mini_batches).tolist()))
        if self.mismatch:
            totals, maxima = zip(*self.mismatch)
            total, top = all_reduce(torch.stack(totals).sum(0), "sum"), all_reduce(torch.stack(maxima).amax(0), "max")
            stats |= {f"mismatch/{k}": v for k, v in mismatch_summary(total, top, correction).items()}
        return stats
