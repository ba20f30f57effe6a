"""A reward with state written outside the package (``tests/outside_rewards``) plugs in through the public interface:
selected by ``class_path``, it samples through the run's context, trains the tiny model, and a run killed with
SIGKILL resumes to the weights and the reward state of an uninterrupted one. Both runs are subprocesses started the
same way on this machine with the same seeded sampling, so their tensors compare exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from helpers import tiny_config

ROOT = Path(__file__).parent.parent
LAUNCHER = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
EVERY_STEP = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
              "init_args": {"every_n_train_steps": 1, "save_last": True, "save_top_k": 0}}


def command(root: Path, model: str, callbacks: list) -> list[str]:
    path = tiny_config(root, model, steps=4)
    config = yaml.safe_load(path.read_text())
    config["model"]["reward"] = {"class_path": "outside_rewards.ParaphraseVote", "init_args": {"answer_samples": 2}}
    config["trainer"] |= {"enable_checkpointing": True, "limit_val_batches": 0, "num_sanity_val_steps": 0}
    config["trainer"]["callbacks"] += [EVERY_STEP, *callbacks]
    path.write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "evolrl", "fit", "--config", str(path), "--ckpt_path", "last"]


def run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER}, "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_reward_written_outside_trains_and_resumes_after_kill_9_to_the_same_weights_and_state(tmp_path, tiny_model):
    whole = run(command(tmp_path / "whole", tiny_model, []))
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run(command(tmp_path / "cut", tiny_model, [{"class_path": "helpers.SignalAt",
                                                         "init_args": {"step": 2, "signum": 9}}]))
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run(command(tmp_path / "cut", tiny_model, []))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, final = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=True) for d in ("whole", "cut"))
    assert final["global_step"] == expected["global_step"] == 4
    assert all(torch.equal(final["state_dict"][k], v) for k, v in expected["state_dict"].items())
    assert final["evolrl"]["rewrite_votes"] == expected["evolrl"]["rewrite_votes"]
    assert expected["evolrl"]["rewrite_votes"]["seen"] == 4 * 2  # 4 steps of 2 prompts


def test_no_file_of_the_package_names_it():
    named = [str(p) for p in (ROOT / "evolrl").rglob("*.py")
             if "ParaphraseVote" in p.read_text() or "outside_rewards" in p.read_text()]
    assert not named
