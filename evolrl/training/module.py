"""The LightningModule: one EVOL-RL / GRPO training step, top to bottom.

Non-obvious decisions:

* Manual optimization. One training step = one rollout batch, split into
  mini-batches (one optimizer step each, in order, one PPO epoch) and micro-batches
  (gradient accumulation). The loss normalizer is fixed per mini-batch before the
  micro-batch loop, so the micro-batch size does not change the math.
* ``old_logprobs`` are recomputed with the policy before the update, not taken from
  the sampler (vLLM's bf16 kernels differ from the trainer's numerics). The first
  mini-batch takes them from its own forward pass (the policy has not moved yet).
* A reference model exists only when ``kl_coef > 0``.
* Rollouts are sampled inside ``training_step`` (``RolloutRequest.sample``), after the
  previous step's weights reached the engine; their weights version is checked.
* A step whose gradient norm is not finite is skipped and counted, never applied.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from evolrl.algorithms import aggregate, clipped_surrogate, group_advantages, low_var_kl
from evolrl.data.datamodule import RolloutRequest
from evolrl.callbacks import LabelFreeDiagnostics, PassAtK, PolicyStats, SampleLogger
from evolrl.models import load_policy
from evolrl.rewards import EvolReward, Reward
from evolrl.distributed import global_sum, shard
from evolrl.training.evaluation import EvaluationSteps
from evolrl.training.optim import Optimization, build_optimizer, total_optimizer_steps
from evolrl.training.sequences import Sequences, micro_batch_plan, pack, sequence_logprobs


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


class EvolRLModule(EvaluationSteps, L.LightningModule):
    """GRPO on a Hugging Face causal LM with a pluggable reward.

    Args:
        model: Hub name, local directory, ``.gguf`` file or ``pkg://package/file`` (see ``evolrl.models``).
        reward: Reward class; default ``EvolReward`` with the packaged MiniLM embedder.
        loss: Policy-loss settings.
        optim: Optimizer and schedule settings.
        mini_batch_size: Sequences per optimizer step (paper: 32, one prompt's G).
        micro_batch_size: Sequences per forward/backward pass.
        temperature: Sampling temperature, so log-probs are those of the sampling policy
            (linked to ``data.temperature`` by the CLI).
        dtype: Policy weights dtype when loaded (use ``trainer.precision`` for mixed precision).
        gradient_checkpointing: Trade compute for activation memory.
        logprob_chunk_size: Tokens per chunk in the log-prob/entropy computation.
        trust_remote_code: Allow the model repository's own code to run.
    """

    def __init__(
        self,
        model: str,
        reward: Reward | None = None,
        loss: GRPOLoss = GRPOLoss(),  # noqa: B008 (frozen-in-spirit config; jsonargparse expands its fields)
        optim: Optimization = Optimization(),  # noqa: B008
        mini_batch_size: int = 32,
        micro_batch_size: int = 2,
        temperature: float = 1.0,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        logprob_chunk_size: int = 1024,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        # Plain values only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "model": model, "loss": asdict(loss), "optim": asdict(optim), "mini_batch_size": mini_batch_size,
            "micro_batch_size": micro_batch_size, "temperature": temperature, "dtype": dtype,
            "gradient_checkpointing": gradient_checkpointing, "logprob_chunk_size": logprob_chunk_size,
        })
        self.automatic_optimization = False
        self.model_name = model
        self.reward = reward if reward is not None else EvolReward()
        self.loss_cfg = loss
        self.optim_cfg = optim
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.dtype_name = dtype
        self.gradient_checkpointing = gradient_checkpointing
        self.logprob_chunk_size = logprob_chunk_size
        self.trust_remote_code = trust_remote_code
        self.policy = None
        self.__dict__["reference"] = None  # see configure_model
        self.weights_pushed = 0
        self._engine_loaded = False
        self.skipped_steps = 0
        self.steps_seen = 0
        self.steps_without_signal = 0

    # ---- set-up -------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        self.policy = load_policy(self.model_name, self.dtype_name, self.trust_remote_code).train()
        if self.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.loss_cfg.kl_coef > 0:
            # Kept out of the module tree: frozen, in eval mode, and not part of checkpoints.
            self.__dict__["reference"] = copy.deepcopy(self.policy).eval().requires_grad_(False)
        if self.device_mesh is not None:  # ModelParallelStrategy: FSDP2 over the data-parallel ranks
            shard(self.policy, self.device_mesh["data_parallel"])
            if self.reference is not None:
                shard(self.reference, self.device_mesh["data_parallel"])

    def configure_optimizers(self):
        total = total_optimizer_steps(self.trainer, self.trainer.datamodule, self.mini_batch_size)
        optimizer, scheduler = build_optimizer(list(self.policy.parameters()), self.optim_cfg, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @property
    def engine(self):
        return self.trainer.datamodule.engine

    def push_weights(self, new_version: bool = True) -> None:
        """Hand the current weights to the rollout engine as version ``weights_pushed - 1``.

        ``new_version=False`` re-sends the current version (a resumed run, or evaluation only).
        """
        if new_version or self.weights_pushed == 0:
            self.weights_pushed += 1
        self.engine.load_weights(self.policy, version=self.weights_pushed - 1)
        self._engine_loaded = True

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["evolrl"] = {
            "weights_pushed": self.weights_pushed,
            "skipped_steps": self.skipped_steps,
            "steps_seen": self.steps_seen,
            "steps_without_signal": self.steps_without_signal,
            "torch_rng_state": torch.get_rng_state(),  # dropout in the policy, if any
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("evolrl")
        if state is None:
            return
        self.weights_pushed = state["weights_pushed"]
        self.skipped_steps = state["skipped_steps"]
        self.steps_seen = state["steps_seen"]
        self.steps_without_signal = state["steps_without_signal"]
        torch.set_rng_state(state["torch_rng_state"])

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)
        self.push_weights(new_version=False)  # version 0, or the resumed checkpoint's version

    # ---- one training step --------------------------------------------------------------
    def training_step(self, request: RolloutRequest, batch_idx: int) -> dict:
        t0 = time.perf_counter()
        rollouts = request.sample()
        if rollouts.weights_version != self.weights_pushed - 1:
            raise RuntimeError(
                f"stale rollouts: sampled with weights version {rollouts.weights_version}, "
                f"but the policy is at version {self.weights_pushed - 1}"
            )
        t1 = time.perf_counter()
        scored = self.reward(rollouts)  # [P, V]
        t2 = time.perf_counter()
        rewards = scored.rewards.gather(1, rollouts.trained)  # [P, G]
        advantages = group_advantages(rewards, self.loss_cfg.scale_by_std)  # [P, G]
        self._check_signal(advantages)
        seqs = pack(rollouts, advantages, self.trainer.datamodule.tokenizer.pad_token_id).to(self.device)
        old_logp, ref_logp = self._reference_logprobs(seqs)
        stats = self._update(seqs, old_logp, ref_logp)
        self.push_weights()
        t3 = time.perf_counter()

        stats |= {
            "advantage_abs": advantages.abs().mean().item(),
            "lr": self.lr_schedulers().get_last_lr()[0],
            "skipped_steps": float(self.skipped_steps),
        }
        timing = {"step": t3 - t0, "sample": t1 - t0, "reward": t2 - t1, "update": t3 - t2}
        # Entropy, lengths and the label-free diagnostics are logged by the callbacks (evolrl.callbacks),
        # which read this step's output.
        logged = {k: v for k, v in stats.items() if k != "entropy"}
        self.log_dict({f"train/{k}": v for k, v in logged.items()}, on_step=True, batch_size=len(seqs))
        self.log_dict({f"time/{k}": v for k, v in timing.items()}, on_step=True, batch_size=len(seqs))
        bar = {"reward": scored.rewards.mean().item(), "entropy": stats["entropy"],
               "len": seqs.response_mask.sum(-1).float().mean().item(), "step_s": timing["step"]}
        self.log_dict(bar, prog_bar=True, logger=False, on_step=True, batch_size=len(seqs))
        return {"rollouts": rollouts, "rewards": scored, "stats": stats, "timing": timing}

    def configure_callbacks(self):
        """evolrl's metric callbacks, unless the trainer was given its own of the same kind."""
        have = {type(c) for c in self.trainer.callbacks}
        defaults = [LabelFreeDiagnostics(), PolicyStats(), PassAtK(), SampleLogger()]
        return [c for c in defaults if type(c) not in have]

    def _check_signal(self, advantages: torch.Tensor) -> None:
        """Warn when no group has reward variance: every advantage is 0 (not NaN) and only KL/entropy act."""
        self.steps_seen += 1
        if bool((advantages == 0).all()):
            self.steps_without_signal += 1
            rank_zero_warn(
                f"training step {self.steps_seen - 1}: all {advantages.shape[0]} groups have equal rewards "
                f"(e.g. every response invalid or identical), so every advantage is 0; "
                f"{self.steps_without_signal} of {self.steps_seen} steps so far had no reward signal"
            )

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
                m = part.response_mask

                def agg(values):
                    return aggregate(values, m, cfg.aggregation, normalizer)

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
