"""Train a few steps with FSDP2 on 2 CPU processes (gloo) and report what each rank ends with.

Lightning's ModelParallelStrategy shards the policy with ``fully_shard`` (evolrl.distributed.shard);
each rank samples its own prompts' groups with the Hugging Face engine. Every rank writes
``rank<r>.json``: a digest of its full (gathered) final weights, a digest of the weights the engine
last received, and the prompt ids it trained on.

    python tools/fsdp_check.py MODEL_DIR OUT_DIR        # MODEL_DIR: any small HF causal LM
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine
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


class Prompts(L.Callback):
    def __init__(self):
        self.ids = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ids += [p.id for p in outputs["rollouts"].prompts]


def main(model_dir: str, out_dir: str) -> None:
    module = EvolRLModule(model_dir, reward=MajorityVoteReward(), mini_batch_size=3, micro_batch_size=2,
                          optim=Optimization(lr=1e-2))
    data = RolloutDataModule(AdditionPrompts(count=8), model=model_dir, engine=RecordingEngine(), prompts_per_step=1,
                             vote_samples=4, trained_samples=3, max_new_tokens=6)
    prompts = Prompts()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2,
                        tensor_parallel_size=1), max_epochs=1, limit_train_batches=3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[prompts])
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
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
