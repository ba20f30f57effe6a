"""EvolRLModule trains on whatever rollout batches it is given: here from a data module with no engine at all, which
replays recorded groups, and the callbacks see the same step outputs as in the run that sampled them."""

from __future__ import annotations

import lightning as L
import torch

from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine, Sampling
from evolrl.training import Batching, EvolRLModule, Optimization
from evolrl.types import RolloutBatch


class Replay(L.LightningDataModule):
    """Yields recorded rollout batches, one per training step, as a user's own data module might."""

    def __init__(self, batches: list[RolloutBatch]) -> None:
        super().__init__()
        self.batches = batches

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.batches, batch_size=None, collate_fn=lambda batch: batch)


class Seen(L.Callback):
    """What a metric callback reads: each step's outputs."""

    def __init__(self) -> None:
        self.outputs = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def train(tiny_model: str, data: L.LightningDataModule, steps: int) -> tuple[EvolRLModule, Seen, L.Trainer]:
    L.seed_everything(0)
    module = EvolRLModule(tiny_model, reward=MajorityVoteReward(), optim=Optimization(lr=1e-2),
                          batching=Batching(mini_batch_size=6, micro_batch_size=3))
    seen = Seen()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[seen])
    trainer.fit(module, data)
    return module, seen, trainer


def test_the_module_trains_on_replayed_groups_the_same_step_outputs(tiny_model):
    sampled = RolloutDataModule(AdditionPrompts(count=8), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                                vote_samples=4, trained_samples=3, sampling=Sampling(max_new_tokens=6))
    module, first, trainer = train(tiny_model, sampled, steps=3)
    assert module.sampler is sampled  # the rollout side: the step takes rollouts and hands weights to it by name

    recorded = [out["rollouts"] for out in first.outputs]
    replayed_module, second, replay_trainer = train(tiny_model, Replay(recorded), steps=3)
    assert replayed_module.sampler is None  # no engine, nothing to push

    assert len(second.outputs) == len(first.outputs) == 3
    for a, b in zip(first.outputs, second.outputs):
        ra, rb = a["rollouts"], b["rollouts"]
        assert ra.groups == rb.groups and torch.equal(ra.trained, rb.trained)
        assert (ra.weights_version, ra.temperature) == (rb.weights_version, rb.temperature)
        torch.testing.assert_close(a["rewards"].rewards, b["rewards"].rewards, rtol=0, atol=0)
        assert a["stats"].keys() == b["stats"].keys()
        # One process, the same weights and sequences: the same numbers, bit for bit.
        assert a["stats"] == b["stats"], {k: (a["stats"][k], b["stats"][k]) for k in a["stats"]}
    for name, value in module.policy.state_dict().items():
        assert torch.equal(value, replayed_module.policy.state_dict()[name]), name


def test_the_training_package_knows_no_engine_and_no_data_module():
    """The module's side of the contract, read from the source: nothing under ``evolrl/training`` imports the rollout
    or the data package, and ``module.py`` names no engine: its step asks the data module, whatever it is, for the
    next rollouts and hands it the new weights by name (``evolrl.rollout.Sampler``)."""
    import ast
    from pathlib import Path

    import evolrl.training

    package = Path(evolrl.training.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("evolrl.rollout", "evolrl.data")), f"{path.name} imports {name}"
    text = (package / "module.py").read_text().lower()
    assert "engine" not in text, "module.py mentions an engine"
    assert "sampler.next_rollouts(batch)" in text and "sampler.hand_weights(self.policy)" in text
