"""Faults of a run as a cluster job meets them: ``python -m evolrl fit`` in a subprocess, its output in a log file,
signals sent to it from outside, requeued with the same command.

RESTRAIN's prompt-weight pass (another model in the same directory; SIGTERM during the pass; the requeue's
weights), a lag changed on resume, a checkpoint only ``--weights_only false`` reads, the curves across a preemption,
and settings that cannot run together. Each on the tiny model with the Hugging Face engine. Where two runs' numbers
are compared exactly, both ran here, in processes started the same way, with the same seeded sampling.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import make_tiny_model, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.checkpoints.run_dir import newest_checkpoint
from evolrl.rewards.restrain.prompt_weights import NAME, read_shares

ROOT = Path(__file__).parent.parent
LAUNCHER = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
LAST = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"every_n_train_steps": 1, "save_last": True, "save_top_k": 0}}


def job_config(root: Path, model: str, steps: int, reward: str = "MajorityVoteReward", callbacks=(), data=None,
               model_settings=None) -> Path:
    """The tiny run in ``root`` for ``steps`` steps: ``last.ckpt`` after each step, no evaluation, progress as lines."""
    path = tiny_config(root, model, steps=steps, reward=reward)
    config = yaml.safe_load(path.read_text())
    config["trainer"] |= {"max_epochs": -1, "max_steps": steps, "limit_train_batches": None, "limit_val_batches": 0,
                          "num_sanity_val_steps": 0, "enable_checkpointing": True, "enable_progress_bar": True}
    config["trainer"]["callbacks"] += [LAST, *callbacks]
    config["data"] |= data or {}
    for key, value in (model_settings or {}).items():
        config["model"][key] = value if not isinstance(value, dict) else config["model"].get(key, {}) | value
    path.write_text(yaml.safe_dump(config))
    return path


def start(args: list[str], log: Path) -> subprocess.Popen:
    """``python -m evolrl fit ARGS`` with stdout and stderr into ``log``, as a batch job's ``--output``."""
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER}, "PYTHONPATH": str(ROOT / "tests")}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "evolrl", "fit", *args], stdout=out, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=env)


def fit(args: list[str], log: Path) -> tuple[int, str]:
    """Runs to the end: the exit code and the log."""
    code = start(args, log).wait(timeout=600)
    return code, log.read_text()


def wait_for(log: Path, text: str, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while text not in log.read_text():
        assert process.poll() is None, f"ended ({process.returncode}) before printing {text!r}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {text!r} in {seconds} s:\n{log.read_text()}"
        time.sleep(0.02)


def last_checkpoint(root: Path) -> dict:
    """The checkpoint ``--ckpt_path last`` would resume (a second run's ``last`` is ``last-v1.ckpt``)."""
    return torch.load(newest_checkpoint(root / "checkpoints"), weights_only=True)


# ---- RESTRAIN's prompt-weight pass -----------------------------------------------------------------------------------
def restrain(root: Path, model: str, count: int = 8, steps: int = 1) -> Path:
    return job_config(root, model, steps, reward="RestrainReward", data={
        "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": count}}},
        model_settings={"reward": {"init_args": {"answers": {"valid_rule": "any", "number_fallback": True},
                                                 "prompt_weights": {"samples": 8}}}})


def weight_files(root: Path) -> dict[str, dict[str, float]]:
    """Each prompt-weight file in ``root``: the model it was measured with -> its shares."""
    out = {}
    for path in sorted(root.glob(f"{NAME}-*.jsonl")):
        key = json.loads(path.read_text().splitlines()[0])["measured_with"]
        out[key["model"]] = read_shares(path, key)
    return out


def test_restrain_with_another_model_in_the_same_directory_measures_its_own_weights(tmp_path, tiny_model):
    other = str(make_tiny_model(tmp_path / "other-model", seed=1))
    config = restrain(tmp_path / "run", tiny_model)
    code, first = fit(["--config", str(config)], tmp_path / "first.log")
    assert code == 0, first
    code, second = fit(["--config", str(config), "--model.model", other], tmp_path / "second.log")
    assert code == 0, second
    assert "RESTRAIN prompt weights: the base model samples 8 responses for each of 8 of 8" in second, second
    files = weight_files(tmp_path / "run")
    assert set(files) == {tiny_model, other}  # the first model's file is kept as it was
    assert last_checkpoint(tmp_path / "run")["evolrl"]["prompt_shares"] == files[other]


def test_sigterm_during_the_prompt_weight_pass_exits_143_and_the_requeue_measures_as_one_pass(tmp_path, tiny_model):
    whole = restrain(tmp_path / "whole", tiny_model, count=200)
    code, log = fit(["--config", str(whole)], tmp_path / "whole.log")
    assert code == 0, log
    assert "RESTRAIN prompt weights: 200 of 200 prompts measured" in log

    cut = restrain(tmp_path / "cut", tiny_model, count=200)
    command = ["--config", str(cut), "--ckpt_path", "last"]
    process = start(command, tmp_path / "cut.log")
    wait_for(tmp_path / "cut.log", "RESTRAIN prompt weights: the base model samples", process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 143  # the bound: a cluster's grace period is 30-60 s
    log = (tmp_path / "cut.log").read_text()
    assert "evolrl: SIGTERM received, stopping at step 0" in log
    assert "stopped during RESTRAIN's prompt-weight pass (" in log
    assert f"--config {cut} --ckpt_path last; exit code 143" in log
    (partial,) = weight_files(tmp_path / "cut").values()
    assert 0 < len(partial) < 200 and not (tmp_path / "cut" / "checkpoints" / "last.ckpt").exists()

    code, log = fit(command, tmp_path / "requeue.log")
    assert code == 0, log
    assert f"each of {200 - len(partial)} of 200 training prompts" in log
    assert weight_files(tmp_path / "cut") == weight_files(tmp_path / "whole")
    assert last_checkpoint(tmp_path / "cut")["evolrl"]["prompt_shares"] == weight_files(tmp_path / "whole")[tiny_model]


# ---- the off-policy lag changed on resume ----------------------------------------------------------------------------
def lagged(root: Path, model: str, steps: int) -> Path:
    return job_config(root, model, steps, data={
        "engine": {"class_path": "evolrl.rollout.HFEngine", "init_args": {"report_logprobs": True}}},
        model_settings={"loss": {"mismatch_correction": {"class_path": "evolrl.algorithms.TokenTruncate"}}})


def queued(checkpoint: dict) -> int:
    (state,) = (v for k, v in checkpoint.items() if isinstance(v, dict) and "rollouts" in v and "prompts" in v)
    return sum(map(len, state["rollouts"]["queues"]))


def test_a_lag_changed_on_resume_drops_the_queued_batches_and_every_lag_resumes(tmp_path, tiny_model):
    config = lagged(tmp_path, tiny_model, steps=6)
    # (lag, steps the run ends at): off-policy, on-policy, back, then a longer line
    for n, (k, steps) in enumerate([(1, 2), (0, 3), (1, 4), (2, 5), (2, 6)]):
        code, log = fit(["--config", str(config), "--ckpt_path", "last", f"--data.max_staleness={k}",
                         f"--trainer.max_steps={steps}"], tmp_path / f"{n}.log")
        assert code == 0, log
        dropped = "queued rollout batch(es), sampled ahead for data.max_staleness=" in log
        assert dropped == (n in (1, 3)), log  # the lag changed with batches in the line (none after lag 0)
        checkpoint = last_checkpoint(tmp_path)
        assert checkpoint["global_step"] == steps and queued(checkpoint) == k


# ---- a checkpoint that only --weights_only false reads ---------------------------------------------------------------
def test_a_whole_checkpoint_outside_the_allow_list_is_named_so_and_resumes_with_weights_only_false(
        tmp_path, tiny_model):
    config = job_config(tmp_path, tiny_model, 2, callbacks=[{"class_path": "helpers.PathInCheckpoint"}])
    code, log = fit(["--config", str(config), "--trainer.max_steps=1"], tmp_path / "first.log")
    assert code == 0, log
    code, log = fit(["--config", str(config), "--ckpt_path", "last"], tmp_path / "refused.log")
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert code == 1 and "truncated" not in log, log
    assert (f"evolrl: error: checkpoint {last} is whole but not loadable with weights_only=True: it holds "
            "pathlib.PurePosixPath") in log and "resume with --weights_only false" in log
    code, log = fit(["--config", str(config), "--ckpt_path", "last", "--weights_only", "false"], tmp_path / "ok.log")
    assert code == 0 and f"resuming from {last} (step 1)" in log, log
    assert torch.load(last, weights_only=False)["global_step"] == 2


# ---- the curves across a preemption ----------------------------------------------------------------------------------
def logged_steps(root: Path, tag: str) -> list[int]:
    """The steps of ``tag`` over every event file under ``root`` (a requeued run writes a new version)."""
    steps = []
    for path in glob.glob(str(root / "**" / "events.out.tfevents.*"), recursive=True):
        events = EventAccumulator(path, size_guidance={"scalars": 0})
        events.Reload()
        steps += [e.step for e in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []
    return sorted(steps)


def test_a_preempted_step_reaches_the_curves_and_the_requeue_leaves_no_gap(tmp_path, tiny_model):
    config = job_config(tmp_path, tiny_model, 4)
    command = ["--config", str(config), "--ckpt_path", "last"]
    process = start(command, tmp_path / "cut.log")
    wait_for(tmp_path / "cut.log", "] step 1/4", process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 143
    stopped = last_checkpoint(tmp_path)["global_step"]
    assert 1 < stopped < 4, (tmp_path / "cut.log").read_text()
    assert logged_steps(tmp_path, "train/loss") == list(range(stopped))  # the stopped step's point included
    code, log = fit(command, tmp_path / "requeue.log")
    assert code == 0, log
    for tag in ("train/loss", "train/entropy", "time/step"):
        assert logged_steps(tmp_path, tag) == [0, 1, 2, 3], tag


# ---- settings that cannot run together -------------------------------------------------------------------------------
@pytest.mark.parametrize(("setting", "named"), [
    (["--data.sampler_process.cpus=[\"{core}\"]"], "data.sampler_process="),  # a core this process may use
    (["--data.max_staleness=1", "--data.engine.init_args.report_logprobs=true",
      "--model.loss.mismatch_correction=evolrl.algorithms.TokenTruncate"], "data.max_staleness=1 is not allowed"),
])
def test_co_rewarding_with_a_line_or_a_sampler_process_is_a_usage_error_before_anything_loads(
        tmp_path, tiny_model, setting, named):
    config = job_config(tmp_path, tiny_model, 1, reward="CoRewardingReward")
    core = max(os.sched_getaffinity(0))
    code, log = fit(["--config", str(config), *(s.format(core=core) for s in setting)], tmp_path / "job.log")
    assert code == 2 and "Traceback" not in log, log
    assert f"error: {named}" in log and "with CoRewardingReward" in log, log
    assert not (tmp_path / "checkpoints").exists()  # stopped before the run took its directory
