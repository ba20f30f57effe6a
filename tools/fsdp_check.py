"""Train a few steps with FSDP2 on CPU processes (gloo) and report what each rank ends with.

Lightning's ModelParallelStrategy shards the policy with ``fully_shard`` (evolrl.distributed.shard);
each rank samples its own prompts' groups with the Hugging Face engine. Every rank writes
``rank<r>.json``: a digest of its full (gathered) final weights, a digest of the weights the engine
last received, and the prompt ids it trained on; rank 0 also saves the full gradient of the first
optimizer step (``grads.pt``).

    python tools/fsdp_check.py MODEL_DIR OUT_DIR        # MODEL_DIR: any small HF causal LM

``--scripted`` replaces sampling by fixed responses per prompt, so that 2 ranks with 1 prompt each
and 1 process with both prompts (``--devices 1 --prompts-per-step 2``) train on the same data and
their first gradients can be compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine
from evolrl.rollout.engine import build_group
from evolrl.rollout.vllm_engine import full_state_dict
from evolrl.training import EvolRLModule, Optimization


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].float().contiguous().numpy().tobytes())
    return h.hexdigest()


class RecordingEngine(HFEngine):
    """The HF engine, also recording the full weights it is handed (the gather the vLLM engine does)."""

    def _load(self, policy):
        super()._load(policy)
        self.received = digest(full_state_dict(policy, torch.float32))


class ScriptedEngine(RecordingEngine):
    """Fixed responses per prompt, two of them right: the same data however prompts are split over ranks."""

    def generate(self, prompts, prompt_ids, sampling):
        stops = self.stops()
        groups = []
        for prompt, ids in zip(prompts, prompt_ids):
            answer = int(prompt.answer)
            texts = [f"The answer is {answer}.", f"{answer}", f"{answer + 1}", "no"][: sampling.n]
            responses = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + stops[:1] for t in texts]
            groups.append(build_group(prompt, ids, responses, stops, sampling.max_new_tokens, self.tokenizer))
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
            grads[name] = (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        if trainer.global_rank == 0:
            torch.save(grads, self.path)


class Prompts(L.Callback):
    def __init__(self):
        self.ids = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ids += [p.id for p in outputs["rollouts"].prompts]


def main(model_dir: str, out_dir: str, devices: int = 2, prompts_per_step: int = 1, scripted: bool = False) -> None:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    group = 3
    module = EvolRLModule(model_dir, reward=MajorityVoteReward(), mini_batch_size=group * prompts_per_step,
                          micro_batch_size=2,  # scripted: no clipping, which would hide a wrong gradient scale
                          optim=Optimization(lr=1e-2, max_grad_norm=1e6 if scripted else 1.0))
    engine = ScriptedEngine() if scripted else RecordingEngine()
    data = RolloutDataModule(AdditionPrompts(count=8), model=model_dir, engine=engine,
                             prompts_per_step=prompts_per_step, vote_samples=group if scripted else 4,
                             trained_samples=group, max_new_tokens=6)
    prompts = Prompts()
    strategy = ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1) if devices > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=1, limit_train_batches=3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[prompts, FirstGradient(Path(out_dir, "grads.pt"))])
    trainer.fit(module, data)
    shards = [p for p in module.policy.parameters() if hasattr(p, "full_tensor")]
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "sharded_params": len(shards),
        "local_numel": sum(p.to_local().numel() for p in shards),
        "full_numel": sum(p.numel() for p in shards),
        "final": digest(full_state_dict(module.policy, torch.float32)),
        "engine_received": data.engine.received,
        "engine_version": data.engine.version,
        "prompts": prompts.ids,
    }
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=1)
    parser.add_argument("--scripted", action="store_true", help="fixed responses instead of sampling")
    a = parser.parse_args()
    main(a.model_dir, a.out_dir, a.devices, a.prompts_per_step, a.scripted)
