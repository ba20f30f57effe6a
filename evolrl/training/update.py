"""The policy update of one training step: GRPO loss, gradient accumulation, optimizer steps.

One training step = one rollout batch, split into mini-batches (one optimizer step each, in
order, one PPO epoch) and micro-batches (gradient accumulation). The loss normalizer is fixed
per mini-batch before the micro-batch loop, so the micro-batch size does not change the math;
across ranks it is the global token count. Loss terms are summed on the device and read once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from evolrl.algorithms import aggregate, clipped_surrogate, low_var_kl
from evolrl.distributed import global_sum
from evolrl.training.sequences import Sequences, micro_batch_plan, sequence_logprobs


@dataclass
class GRPOLoss:
    """Policy-loss settings (EVOL-RL defaults; TTRL uses ``clip_high=0.2, entropy_coef=0``)."""

    clip_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - clip_low``."""
    clip_high: float = 0.28
    """Upper clip range, ``1 + clip_high`` (EVOL-RL's asymmetric clip; TTRL 0.2)."""
    dual_clip: float | None = 3.0
    """Cap on the loss of a negative-advantage token, ``-A * dual_clip``; ``null`` turns it off."""
    kl_coef: float = 0.001
    """Weight of the low-variance KL to the initial policy; 0 drops the reference model."""
    entropy_coef: float = 0.003
    """Weight of the entropy bonus (EVOL-RL 0.003; TTRL 0)."""
    aggregation: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """``token_mean`` over the mini-batch's response tokens, or the paper's per-sequence mean."""
    scale_by_std: bool = True
    """Divide advantages by the group's std (GRPO); ``false`` is Dr. GRPO."""


class PolicyUpdate:
    """Mixed into the LightningModule; uses its ``policy``, ``reference``, ``loss_cfg``, ``optim_cfg``,
    batch sizes and optimizers."""

    def _forward(self, model, seqs: Sequences) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(model, seqs, self.temperature, self.logprob_chunk_size)

    def _plan(self, n: int) -> list[list[tuple[int, int]]]:
        return micro_batch_plan(n, self.mini_batch_size, self.micro_batch_size)

    @torch.no_grad()
    def _reference_logprobs(self, seqs: Sequences) -> tuple[list[torch.Tensor | None], list[torch.Tensor] | None]:
        """Per micro-batch (in :meth:`_plan` order) log-probs of the policy before the update and of the reference.

        The first mini-batch's old log-probs are ``None``: the policy has not changed yet when it is trained on,
        so its own forward pass gives them (detached) and a separate pass would compute the same numbers.
        """
        plan = self._plan(len(seqs))
        old, ref = [None] * len(plan[0]), [] if self.reference is not None else None
        for i, (start, stop) in enumerate(r for mini in plan for r in mini):
            part = seqs.slice(start, stop)
            if i >= len(plan[0]):
                old.append(self._forward(self.policy, part)[0])
            if ref is not None:
                ref.append(self._forward(self.reference, part)[0])
        return old, ref

    def _update(self, seqs: Sequences, old_logp, ref_logp) -> dict[str, float]:
        cfg = self.loss_cfg
        opt, sched = self.optimizers(), self.lr_schedulers()
        sums: dict[str, torch.Tensor] = {}  # summed on the device, read once at the end (no per-term sync)
        plan = self._plan(len(seqs))
        index = -1  # position in the flattened plan, matching old_logp / ref_logp
        for minibatch in plan:
            mb_start, mb_stop = minibatch[0][0], minibatch[-1][1]
            mask = seqs.response_mask[mb_start:mb_stop]
            # Fixed before the micro-batch loop: accumulation does not change the loss. Across ranks it is the
            # global count, scaled by the world size because data-parallel gradients are averaged.
            local = mask.sum() if cfg.aggregation == "token_mean" else torch.tensor(mb_stop - mb_start)
            normalizer = global_sum(local.float()) / self.trainer.world_size
            for start, stop in minibatch:
                index += 1
                part = seqs.slice(start, stop)
                logp, entropy = self._forward(self.policy, part)
                old = old_logp[index] if old_logp[index] is not None else logp.detach()
                pg, clips = clipped_surrogate(logp, old, part.advantages[:, None],
                                              cfg.clip_low, cfg.clip_high, cfg.dual_clip)
                agg = partial(aggregate, mask=part.response_mask, mode=cfg.aggregation, normalizer=normalizer)
                terms = {"pg_loss": agg(pg), "entropy": agg(entropy)}
                loss = terms["pg_loss"] - cfg.entropy_coef * terms["entropy"]
                if ref_logp is not None:
                    terms["kl"] = agg(low_var_kl(logp, ref_logp[index]))
                    loss = loss + cfg.kl_coef * terms["kl"]
                self.manual_backward(loss)
                terms["loss"] = loss
                terms |= {f"{name}_frac": agg(flag.float()) for name, flag in clips.items()}
                for name, value in terms.items():
                    sums[name] = sums.get(name, 0.0) + value.detach().float()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.optim_cfg.max_grad_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2
            if torch.isfinite(grad_norm):  # the one host sync per optimizer step
                opt.step()
                sched.step()
            else:
                self.skipped_steps += 1
            opt.zero_grad()
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm.detach().float()
        values = torch.stack(list(sums.values())).div(len(plan)).tolist()
        return dict(zip(sums, values))
