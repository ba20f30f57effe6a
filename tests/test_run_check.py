"""One run check (``evolrl/run_check.py``): ``python -m evolrl fit`` and a bare ``Trainer.fit`` with the same classes
refuse a combination of settings that cannot run together, with the same message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from helpers import build_config

from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine
from evolrl.settings import SettingError
from evolrl.training import Batching, EvolRLModule

ROOT = Path(__file__).parent.parent


def test_the_cli_and_a_bare_fit_refuse_the_same_combination_with_the_same_message(tmp_path, tiny_model):
    # Off-policy batches with an engine that does not report the log-probs it sampled with: a rule between the data
    # module's lag, its engine and the module's loss.
    path = build_config(tmp_path, tiny_model)
    config = yaml.safe_load(path.read_text())
    config["model"]["reward"] = {"class_path": "evolrl.rewards.MajorityVoteReward"}
    config["data"]["max_staleness"] = 1
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    cli = subprocess.run([sys.executable, "-m", "evolrl", "fit", "--config", str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)

    module = EvolRLModule(tiny_model, reward=MajorityVoteReward(),
                          batching=Batching(mini_batch_size=2, micro_batch_size=2))
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=1,
                             vote_samples=2, trained_samples=2, max_staleness=1)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(SettingError) as refused:
        trainer.fit(module, data)

    message = str(refused.value)
    assert message.startswith("data.max_staleness=1 is not allowed: 0 with HFEngine")
    assert cli.returncode == 2, cli.stderr[-2000:]
    assert f"error: {message} (in the configuration of `fit`)" in cli.stderr
    assert data.tokenizer is None  # refused before the data module loaded anything
