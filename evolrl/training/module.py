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
from dataclasses import asdict

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from evolrl.algorithms import group_advantages
from evolrl.callbacks import LabelFreeDiagnostics, PassAtK, PolicyStats, SampleLogger
from evolrl.data.datamodule import RolloutRequest
from evolrl.distributed import shard
from evolrl.models import load_policy
from evolrl.rewards import EvolReward, Reward
from evolrl.training.evaluation import EvaluationSteps
from evolrl.training.optim import Optimization, build_optimizer, total_optimizer_steps
from evolrl.training.sequences import pack
from evolrl.training.update import GRPOLoss, PolicyUpdate


class EvolRLModule(PolicyUpdate, EvaluationSteps, L.LightningModule):
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
        self._engine_loaded = False  # the restored weights still have to reach the engine

    def on_fit_start(self) -> None:
        if self.reference is not None:
            self.reference.to(self.device)

    def on_train_start(self) -> None:
        # Not in on_fit_start: with a sharded checkpoint Lightning restores it only after on_fit_start.
        if not self._engine_loaded:
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
        t3 = time.perf_counter()
        self.push_weights()
        t4 = time.perf_counter()

        stats |= {
            "advantage_abs": advantages.abs().mean().item(),
            "lr": self.lr_schedulers().get_last_lr()[0],
            "skipped_steps": float(self.skipped_steps),
        }
        timing = {"step": t4 - t0, "sample": t1 - t0, "reward": t2 - t1, "update": t3 - t2, "sync": t4 - t3}
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
