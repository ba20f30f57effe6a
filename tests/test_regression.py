"""A fixed-seed tiny-model run whose final parameters, losses and evaluation numbers were recorded.

A refactor must leave them unchanged. The numbers in ``regression/tiny_run.json`` were written by
``python tests/test_regression.py`` (record mode) on the code before the change they guard; the
config below may change its spelling with the code, never its meaning. Re-record only in a commit
that changes a random stream on purpose, and say so in its message.

The run: the real tokenizer and a tiny random Llama, the Hugging Face engine (seeded per weights
version), EvolReward with the real MiniLM embedder, KL to the reference, entropy bonus, asymmetric
clipping, temperature 0.8, uneven micro-batches, two epochs of three steps, evaluation before
training and after every step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from test_training import scalars

RECORD = Path(__file__).parent / "regression" / "tiny_run.json"
TAGS = ["train/loss", "train/pg_loss", "train/kl", "train/entropy", "train/reward_mean", "train/grad_norm",
        "train/clip_high_frac", "train/novelty_mean", "val/addition/pass@1", "val/addition/maj@4"]


def config(tmp_path: Path, model: str) -> Path:
    config = {
        "seed_everything": 3,
        "trainer": {
            "accelerator": "cpu", "max_epochs": 2, "limit_train_batches": 3, "log_every_n_steps": 1,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "val_check_interval": 1, "num_sanity_val_steps": -1,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "regression"}},
            "callbacks": [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [1, 4], "maj_ks": [4]}}],
        },
        "model": {
            "model": model,
            "reward": {"class_path": "evolrl.rewards.EvolReward",
                       "init_args": {"valid_rule": "any", "number_fallback": True, "novelty": {"alpha": 0.3}}},
            "loss": {"clip_low": 0.2, "clip_high": 0.25, "kl_coef": 0.01, "entropy_coef": 0.002},
            "optim": {"lr": 1e-4, "warmup_ratio": 0.2},
            "mini_batch_size": 5, "micro_batch_size": 3,
            "fused_head": False,  # the log-probs from the logits, as recorded; the fused head rounds differently
        },
        "data": {
            "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 8}},
            "engine": {"class_path": "evolrl.rollout.HFEngine"},
            "prompts_per_step": 2, "vote_samples": 5, "trained_samples": 4,
            "sampling": {"temperature": 0.8, "max_new_tokens": 10}, "seed": 5,
            "eval_sets": [{"class_path": "evolrl.data.EvalSet", "init_args": {
                "name": "addition", "source": {"class_path": "evolrl.data.AdditionPrompts",
                                               "init_args": {"count": 4, "seed": 1}}}}],
            "eval_samples": 4, "eval_sampling": {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 6},
        },
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(tmp_path: Path, model: str) -> dict:
    from evolrl.cli import main

    cli = main(["fit", "--config", str(config(tmp_path, model))])
    logged = scalars(tmp_path)
    params = {name: [float(t.double().sum()), float(t.double().abs().sum()), float(t.double().square().sum())]
              for name, t in cli.model.policy.state_dict().items()}
    return {"scalars": {tag: logged[tag] for tag in TAGS}, "params": params}


def test_a_fixed_seed_run_ends_where_it_was_recorded(tmp_path, tiny_model, minilm, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    recorded = json.loads(RECORD.read_text())
    now = run(tmp_path, tiny_model)
    for tag in TAGS:
        assert len(now["scalars"][tag]) == len(recorded["scalars"][tag]), tag
        torch.testing.assert_close(torch.tensor(now["scalars"][tag], dtype=torch.float64),
                                   torch.tensor(recorded["scalars"][tag], dtype=torch.float64),
                                   rtol=1e-6, atol=1e-9, msg=lambda m, tag=tag: f"{tag}: {m}")
    assert now["params"].keys() == recorded["params"].keys()
    for name, values in recorded["params"].items():
        torch.testing.assert_close(torch.tensor(now["params"][name], dtype=torch.float64),
                                   torch.tensor(values, dtype=torch.float64), rtol=1e-6, atol=1e-9,
                                   msg=lambda m, name=name: f"{name}: {m}")


if __name__ == "__main__":  # record mode
    import os
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tiny import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_tiny_model(Path(tmp) / "tiny-llama"))
        result = run(Path(tmp) / "run", model)
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(result, indent=1) + "\n")
    print(f"recorded {len(result['params'])} tensors and {len(TAGS)} curves in {RECORD}")
