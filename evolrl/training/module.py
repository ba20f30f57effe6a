"""The LightningModule: one EVOL-RL / GRPO training step, top to bottom. Its non-obvious decisions:
* Manual optimization: one training step = one rollout batch, one optimizer step per mini-batch (one PPO epoch), in
  a :class:`~evolrl.training.update.GRPOUpdate` the module holds; a non-finite gradient norm skips the step, counted.
* ``old_logprobs`` are recomputed with the policy before the update, not taken from the sampler (vLLM's kernels
  differ from the trainer's), from the first mini-batch's own pass or a reward's pass (``scoring.py``). Off-policy
  they are decoupled PPO's proximal policy; the sampler's are the behaviour's (``evolrl/rollout/supply.py``).
* A reference model exists only when ``kl_coef > 0``; the policy's weights stay in ``dtype`` under bf16 precision,
  only copies are bf16 (``build.py``). Under bf16-mixed the update clears autocast's weight cache per optimizer step.
* The step takes its rollouts from its sampler, the data module held as an ``evolrl.types.Sampler``, by name, and
  hands it the new weights at its end (``evolrl/rollout/sampler.py``); the loader's batch is a plain request of
  prompts. Rollouts more than ``max_staleness`` versions old are refused. A data module of recorded rollouts samples
  nothing: its batches are trained as they are.
* A "step" is a training step everywhere (``global_step``, ``max_steps``, checkpoints, curves, ``val_check_interval``):
  one rollout batch, however many optimizer steps it takes.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from functools import partial
from typing import Any

import lightning as L
import torch

from evolrl.algorithms import GroupAdvantages, MismatchCorrection, Overlong
from evolrl.callbacks import missing_defaults
from evolrl.logprobs import check, keep_freed_memory
from evolrl.lora import LoRA, adapter_state, check_targets, with_base
from evolrl.models import empty_policy, model_config
from evolrl.rewards import EvolReward, Reward
from evolrl.run_check import check_run
from evolrl.settings import check_choice, require
from evolrl.training.batching import Batching
from evolrl.training.build import DTYPES, Dtypes, Frozen, build_models
from evolrl.training.evaluation import grade_request
from evolrl.training.loss import GRPOLoss, as_config
from evolrl.training.optim import CountedOnce, Optimization, build_optimizer, start_schedule_once
from evolrl.training.reward_hooks import RewardHooks
from evolrl.training.run_checks import FlatRewardCheck
from evolrl.training.scoring import Scoring, fewest, fresh, lag, score_rounds
from evolrl.training.update import GRPOUpdate
from evolrl.types import EvalOutput, RolloutBatch, Sampler, StepOutput


class EvolRLModule(L.LightningModule):
    """GRPO on a Hugging Face causal LM with a pluggable reward.

    Args:
        model: Hub name, local directory, ``.gguf`` file or ``pkg://package/file`` (see ``evolrl.models``).
        reward: Reward class; default ``EvolReward`` with the packaged MiniLM embedder.
        advantages: How a group's rewards become advantages (``scale_by_std``).
        loss: The loss: surrogate, KL, entropy bonus, aggregation, mismatch correction.
        overlong: Overlong shaping (DAPO, ``class_path``): ``evolrl.algorithms.OverlongPenalty`` or
            ``OverlongMask``; ``null``: off.
        optim: Optimizer and schedule settings.
        batching: Mini-batches (one optimizer step each), micro-batches (one pass each: by count or a token budget,
            padded or packed) and the fused LM head (``evolrl.training.Batching``).
        dtype: Policy weights dtype when loaded: the optimizer's master weights (use ``trainer.precision`` for bf16).
        reference_dtype: The frozen reference's dtype; ``auto``: bfloat16 under bf16 precision, else ``dtype``.
        fsdp_param_dtype: Under FSDP, the dtype of the all-gathered copies of the weights that forward and backward
            use (the shards keep ``dtype``; gradients are reduced in float32); ``auto`` as ``reference_dtype``.
        lora: Low-rank adapters (peft) on a frozen base: only they train, and the KL reference is the base;
            ``null``: full fine-tuning.
        gradient_checkpointing: Trade compute for activation memory: true every decoder layer, n every n-th (0, n, ...).
        trust_remote_code: Allow the model repository's own code to run.
        cpu_keep_freed_memory: Training on a CPU, keep freed buffers in glibc's heap for reuse instead of unmapping
            and page-faulting them in again (``logprobs/allocator.py``; process-wide).

    The loss's log-probs are ``softmax(logits / T)``'s at each rollout batch's sampling temperature
    (``RolloutBatch.temperature``).
    """

    def __init__(
        self,
        model: str,
        reward: Reward | None = None,
        advantages: GroupAdvantages = GroupAdvantages(),  # noqa: B008 (frozen)
        loss: GRPOLoss = GRPOLoss(),  # noqa: B008 (frozen-in-spirit config; jsonargparse expands its fields)
        overlong: Overlong | None = None,
        optim: Optimization = Optimization(),  # noqa: B008
        batching: Batching = Batching(),  # noqa: B008 (frozen)
        dtype: str = "float32",
        reference_dtype: str = "auto",
        fsdp_param_dtype: str = "auto",
        lora: LoRA | None = None,
        gradient_checkpointing: bool | int = False,
        trust_remote_code: bool = False,
        cpu_keep_freed_memory: bool = True,
    ) -> None:
        super().__init__()
        require(bool(model), "EvolRLModule.model", model,
                allowed="a Hub name, a directory, a .gguf file or pkg://package/file")
        check_choice("EvolRLModule.dtype", dtype, ("float32", "bfloat16", "float16"))
        check_choice("EvolRLModule.reference_dtype", reference_dtype, DTYPES)
        check_choice("EvolRLModule.fsdp_param_dtype", fsdp_param_dtype, DTYPES)
        # Plain values only, so checkpoints load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "model": model, "advantages": asdict(advantages), "loss": loss.as_dict(),
            "overlong": as_config(overlong), "optim": asdict(optim), "batching": asdict(batching), "dtype": dtype,
            "reference_dtype": reference_dtype, "fsdp_param_dtype": fsdp_param_dtype,
            "gradient_checkpointing": gradient_checkpointing, "lora": asdict(lora) if lora is not None else None,
        })
        self.automatic_optimization = False
        self.model_name = model
        self.reward = reward if reward is not None else EvolReward()
        self.reward_hooks = RewardHooks(self.reward)  # its check, start, before-step and checkpoint hooks
        self.advantages = advantages
        require(overlong is None or isinstance(overlong, Overlong), "EvolRLModule.overlong", overlong,
                allowed="null, evolrl.algorithms.OverlongPenalty or evolrl.algorithms.OverlongMask")
        self.overlong = overlong
        self.update = GRPOUpdate(loss, batching, optim.max_grad_norm, optim.max_consecutive_skips,
                                 backward=self.manual_backward)
        self.optim_cfg = optim
        self.dtype_name, self.reference_dtype, self.fsdp_param_dtype = dtype, reference_dtype, fsdp_param_dtype
        require(isinstance(gradient_checkpointing, int) and gradient_checkpointing >= 0,  # a bool is an int
                "EvolRLModule.gradient_checkpointing", gradient_checkpointing, allowed="true, false or an integer >= 0")
        self.gradient_checkpointing = gradient_checkpointing
        require(lora is None or isinstance(lora, LoRA), "EvolRLModule.lora", lora,
                allowed="null (full fine-tuning) or an evolrl.lora.LoRA")
        self.lora, self.trust_remote_code = lora, trust_remote_code
        if lora is not None:  # its targets against the architecture alone (config.json, on the meta device)
            check_targets(lora, empty_policy(model_config(model, trust_remote_code)))
        require(isinstance(cpu_keep_freed_memory, bool), "EvolRLModule.cpu_keep_freed_memory", cpu_keep_freed_memory,
                allowed="true or false")
        self.cpu_keep_freed_memory = cpu_keep_freed_memory
        self.policy = None  # the trained model; the step hands its weights to the sampler
        self.reference: Frozen | None = None
        self.flat_rewards = FlatRewardCheck()

    # ---- set-up -------------------------------------------------------------------------
    @property
    def mismatch_correction(self) -> MismatchCorrection | None:  # when set, rollouts carry the sampler's log-probs
        return self.update.loss.mismatch_correction

    def setup(self, stage: str) -> None:
        precision = str(self.trainer.precision)
        require(not precision.startswith("16"), "trainer.precision", precision,
                allowed="bf16-mixed, bf16-true or 32 (float16 would need loss scaling, which the manual update "
                "does not do)")
        if stage == "fit":
            check_run(self, self.trainer.datamodule, self.trainer)  # without the CLI, which checked before loading
            if self.cpu_keep_freed_memory and self.trainer.strategy.root_device.type == "cpu":
                keep_freed_memory()

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        dtypes = Dtypes.resolve(str(self.trainer.precision), self.dtype_name, reference=self.reference_dtype,
                                fsdp_param=self.fsdp_param_dtype, base=self.lora.base_dtype if self.lora else "auto")
        mesh = self.device_mesh["data_parallel"] if self.device_mesh is not None else None  # ModelParallelStrategy
        self.policy, reference = build_models(
            self.model_name, dtypes, with_reference=self.update.loss.kl_coef > 0, mesh=mesh,
            device=self.trainer.strategy.root_device, gradient_checkpointing=self.gradient_checkpointing,
            trust_remote_code=self.trust_remote_code, passes=self.update.batching.passes, lora=self.lora)
        self.reference = Frozen(reference) if reference is not None else None

    def configure_optimizers(self):  # the trainable parameters: all, or the adapters of a LoRA run
        optimizer, scheduler = build_optimizer([p for p in self.policy.parameters() if p.requires_grad], self.optim_cfg)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None and self.device_mesh is None:  # adapters only; a sharded (FSDP2) one stays whole
            checkpoint["state_dict"] = adapter_state(checkpoint["state_dict"])
        skips = {"skipped_steps": self.update.skipped_steps, "skips_in_a_row": self.update.skips_in_a_row}
        checkpoint["evolrl"] = {**skips, **self.flat_rewards.state_dict(), **self.reward.state_dict(),
                                "torch_rng_state": torch.get_rng_state()}  # dropout in the policy, if any

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.lora is not None and "state_dict" in checkpoint:  # base from the loaded model; adapters must be there
            checkpoint["state_dict"] = with_base(checkpoint["state_dict"], self.state_dict())
        state = checkpoint.get("evolrl")
        if state is None:
            return
        self.update.skipped_steps = state["skipped_steps"]
        self.update.skips_in_a_row = state.get("skips_in_a_row", 0)
        self.flat_rewards.load_state_dict(state)
        self.reward.load_state_dict(state)
        torch.set_rng_state(state["torch_rng_state"])

    def on_fit_start(self) -> None:
        if self.reference is not None and isinstance(self.reference.model, torch.nn.Module):  # not LoRA's
            self.reference.model.to(self.device)
        check(self.policy, self.device, self.update.batching.passes,
              precision=self.trainer.precision_plugin.forward_context)

    @property
    def sampler(self) -> Sampler | None:  # the data module when it samples; none: recorded rollouts
        data = self.trainer.datamodule
        return data if isinstance(data, Sampler) else None

    def on_train_start(self) -> None:  # not at fit's start: a sharded checkpoint is restored after on_fit_start
        self.sampler.hand_weights(self.policy, new=False) if self.sampler is not None else None
        if self.trainer.training:  # e.g. a teacher from the policy, a pass of the base model
            self.reward_hooks.start(self, self.trainer)

    on_validation_start = on_test_start = on_train_start

    # ---- one training step --------------------------------------------------------------
    def training_step(self, batch: RolloutBatch | Any, batch_idx: int) -> StepOutput:
        t0, step, sampler = time.perf_counter(), self.trainer.global_step, self.sampler
        recorded = isinstance(batch, RolloutBatch)  # trained as it is; else the loader's request, sampled now
        rollouts = fresh(batch if recorded else sampler.next_rollouts(batch), step, sampler.max_staleness if sampler
                         else 0)
        t1 = time.perf_counter()
        before = self.reward_hooks.before_step(step)  # what the reward's own work before scoring logs (a teacher's)
        scoring = Scoring(self.reward, self.advantages, self.overlong, self.device,
                          policy_pass=lambda seqs, temperature: self.update.policy_pass(self.policy, seqs, temperature),
                          vocabulary=self.policy.get_output_embeddings().weight.shape[0], step=step,
                          context=self.reward_hooks.context)
        further = sampler.further_rollouts if sampler else None  # dynamic sampling's next rounds, if any
        scored = score_rounds(scoring, rollouts, 1 if recorded else batch.max_rounds, further,  # kept over the rounds
                              partial(fewest, self.trainer.strategy, self.device))
        t2 = time.perf_counter()
        self.flat_rewards(scored.advantages)
        seqs = scored.seqs
        start_schedule_once(self.lr_schedulers(), self.trainer, self.update.optimizer_steps(rollouts.trained.numel()))
        optimizer = CountedOnce(self.optimizers(), self.trainer.strategy, self.update.optimizer_steps(len(seqs)))
        stats = self.update(self.policy, self.reference.model if self.reference else None, seqs,
                            temperature=rollouts.temperature, optimizer=optimizer, scheduler=self.lr_schedulers())
        t3 = time.perf_counter()
        sync = sampler.hand_weights(self.policy) if sampler else 0.0  # the next step samples with these weights
        stats |= scored.stats | before | {
            "advantage_abs": scored.advantages.abs().mean().item(),
            "lr": self.optimizers().param_groups[0]["lr"],
            "skipped_steps": float(self.update.skipped_steps),
            "lag": lag(rollouts, step),  # versions behind the policy it trains
        }
        timing = {"step": t3 - t0, "sample": t1 - t0, "reward": t2 - t1, "update": t3 - t2, "sync": sync,
                  **(sampler.timings() if sampler else {}), **self.reward.timings()}
        # Entropy, lengths and the label-free diagnostics: the callbacks (evolrl.callbacks) read the output.
        logged = {k if k.startswith("mismatch/") else f"train/{k}": v for k, v in stats.items() if k != "entropy"}
        self.log_dict(logged, on_step=True, batch_size=len(seqs))
        self.log_dict({f"time/{k}": v for k, v in timing.items()}, on_step=True, batch_size=len(seqs))
        bar = {"reward": scored.rewards.rewards.nanmean().item(), "entropy": stats["entropy"],
               "len": scored.response_length(), "step_s": timing["step"]}
        self.log_dict(bar, prog_bar=True, logger=False, on_step=True, batch_size=len(seqs))
        return StepOutput(rollouts=scored.rollouts, rewards=scored.rewards, stats=stats, timing=timing)

    def validation_step(self, request, batch_idx: int, dataloader_idx: int = 0) -> EvalOutput:
        """The batch's problems sampled and graded; answers and correctness are ``[problems][n]``."""
        return grade_request(request, self.sampler.eval_rollouts(request))

    test_step = validation_step

    def configure_callbacks(self):
        """evolrl's metric callbacks, unless the trainer was given its own of the same kind."""
        return missing_defaults(self.trainer.callbacks)

