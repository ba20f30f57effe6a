"""Every curve evolrl writes moves forward: over a two-epoch run no tag repeats or goes back in step."""

from __future__ import annotations

import glob
import itertools
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.cli import main

TEXT_TAG = "train/samples/text_summary"


def two_epoch_config(tmp_path: Path, model: str) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "max_epochs": 2, "limit_train_batches": 2, "log_every_n_steps": 1,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "val_check_interval": 1, "num_sanity_val_steps": -1,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "steps"}},
        },
        "model": {
            "model": model,
            "reward": {"class_path": "evolrl.rewards.EvolReward",
                       "init_args": {"answers": {"valid_rule": "any", "number_fallback": True}}},
            "batching": {"mini_batch_size": 4, "micro_batch_size": 2}, "optim": {"lr": 1e-3},
        },
        "data": {
            "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 8}},
            "engine": {"class_path": "evolrl.rollout.HFEngine"},
            "prompts_per_step": 2, "vote_samples": 4, "trained_samples": 3, "sampling": {"max_new_tokens": 6},
            "eval_sets": [{"class_path": "evolrl.data.EvalSet", "init_args": {
                "name": "addition", "source": {"class_path": "evolrl.data.AdditionPrompts",
                                               "init_args": {"count": 4, "seed": 1}}}}],
            "eval_samples": 4, "eval_sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 6},
        },
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_every_tag_has_strictly_increasing_steps_over_two_epochs(tmp_path, tiny_model, minilm, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(two_epoch_config(tmp_path, tiny_model))])
    files = glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    assert len(files) == 1, files
    events = EventAccumulator(files[0], size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"] if tag != "epoch"}
    steps[TEXT_TAG] = [e.step for e in events.Tensors(TEXT_TAG)]
    for tag, xs in steps.items():
        assert xs and all(a < b for a, b in itertools.pairwise(xs)), f"{tag}: steps {xs}"
    # 2 epochs x 2 training steps: every per-step curve has 4 points at the training steps 0..3, the sample
    # text included (it sits at the x of the step whose responses it shows)
    assert steps["train/loss"] == steps["train/entropy"] == steps["train/reward_mean"] == [0, 1, 2, 3]
    assert steps[TEXT_TAG] == steps["train/loss"]
    # the default PassAtK (4 samples per problem: pass@1, pass@4, maj@4) before training and after each step
    for name in ("pass@1", "pass@4", "maj@4"):
        assert steps[f"val/addition/{name}"] == [0, 1, 2, 3, 4], name
    assert len(steps["train_epoch/entropy"]) == len(steps["train_epoch/response_length"]) == 2
