"""A run as a cluster job runs it, through ``python -m evolrl fit`` (``evolrl.checkpoints``, docs/cluster.md).

Preemption, resume with changed settings, a NaN reward, a full disk, two runs on one directory and progress in a log
file, each on the tiny model with the Hugging Face engine. Exact resume compares the weights with ``torch.equal``:
both runs are in this process, on this machine, with the same seeded sampling, as the other resume tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import make_tiny_model, tiny_config

from evolrl.checkpoints import RunLock
from evolrl.cli import main
from evolrl.compare.paired import evaluated_step, read_rows
from evolrl.data.sources import DataError
from evolrl.training import GRPOLoss, GRPOUpdate
from evolrl.training.batching import Batching
from evolrl.training.run_checks import TrainingStopped

ROOT = Path(__file__).parent.parent


def run_config(tmp_path: Path, model: str, steps: int = 4, callbacks=(), checkpoints: dict | None = None,
               **trainer) -> Path:
    """The tiny two-prompt run of ``steps`` steps in ``tmp_path`` (its root directory), Lightning's default
    checkpointing unless ``checkpoints`` (a ModelCheckpoint's settings) is given; TTRL's reward (no embedder)."""
    path = tiny_config(tmp_path, model, steps=steps, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["trainer"] |= {"default_root_dir": str(tmp_path), "enable_checkpointing": True, **trainer}
    config["trainer"]["callbacks"] += list(callbacks)
    if checkpoints is not None:
        config["trainer"]["callbacks"].append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                               "init_args": checkpoints})
    path.write_text(yaml.safe_dump(config))
    return path


def weights(cli) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in cli.model.policy.state_dict().items()}


@pytest.fixture(autouse=True)
def plain_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])


def test_sigterm_saves_exits_143_and_the_resumed_run_ends_as_an_uninterrupted_one(tmp_path, tiny_model, capsys):
    expected = weights(main(["fit", "--config", str(run_config(tmp_path / "whole", tiny_model))]))

    config = run_config(tmp_path / "cut", tiny_model,
                        callbacks=[{"class_path": "helpers.SignalAt", "init_args": {"step": 2}}])
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--ckpt_path", "last"])
    out = capsys.readouterr().out
    assert stopped.value.code == 143  # 128 + SIGTERM
    assert f"no checkpoint under {tmp_path / 'cut' / 'checkpoints'}: starting at step 0" in out
    last = tmp_path / "cut" / "checkpoints" / "last.ckpt"
    assert f"SIGTERM received, stopping at step 3" in out and f"saved {last} (step 3)" in out
    assert f"resume with: python -m evolrl fit --config {config} --ckpt_path last; exit code 143" in out
    assert torch.load(last, weights_only=True)["global_step"] == 3

    # the requeue: the same command; the signal callback fires at step 2 only, which the run is past
    resumed = main(["fit", "--config", str(config), "--ckpt_path", "last"])
    assert f"resuming from {last} (step 3)" in capsys.readouterr().out
    assert resumed.trainer.global_step == 4
    final = weights(resumed)
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in expected)


def responses_to(directory: Path) -> dict:
    """An ``EvalResponses`` callback writing into ``directory``."""
    return {"class_path": "evolrl.callbacks.EvalResponses", "init_args": {"output_dir": str(directory)}}


def evaluations(directory: Path) -> dict[int, list]:
    """``{step: every response's tokens}`` of each evaluation written under ``directory``."""
    return {evaluated_step(f): [r["tokens"] for row in read_rows(f) for r in row["responses"]]
            for f in directory.glob("val_responses_step*.jsonl")}


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, tiny_model):
    """The 4-step run uninterrupted (an evaluation after every step): its weights and its evaluations' responses."""
    root = tmp_path_factory.mktemp("whole")
    cli = main(["fit", "--config", str(run_config(root, tiny_model, callbacks=[
        responses_to(root / "responses")]))])
    return weights(cli), evaluations(root / "responses")


BY_MAX_STEPS = {"max_epochs": -1, "max_steps": 4, "limit_train_batches": None}
"""The same 4 steps (the one epoch of 4 batches) as a length in steps: resumed at step 4, the fit loop has ended."""


@pytest.mark.parametrize("signal_at, length", [
    ({"class_path": "helpers.SignalAt", "init_args": {"step": 3}}, {}),  # the last step: its evaluation is the last
    ({"class_path": "helpers.SignalAt", "init_args": {"step": 3}}, BY_MAX_STEPS),
    ({"class_path": "helpers.SignalInEvaluation", "init_args": {"step": 4}}, BY_MAX_STEPS),
    ({"class_path": "helpers.SignalAt", "init_args": {"step": 1}}, {}),  # a step in the middle
    ({"class_path": "helpers.SignalInEvaluation", "init_args": {"step": 2}}, {}),  # the evaluation cut short
], ids=["before-the-last-evaluation", "before-the-last-evaluation-of-max-steps", "during-the-last-evaluation",
        "before-an-evaluation", "during-an-evaluation"])
def test_the_resumed_run_makes_the_evaluation_the_signal_skipped_first(tmp_path, tiny_model, whole_run, signal_at,
                                                                         length, capsys):
    """The signal stops the run where an evaluation was due or under way; the requeued run evaluates those weights
    before it trains on (or ends, where the step was its last), so it has every evaluation of the uninterrupted run,
    with the same sampled tokens (both runs in this process, with the same seeded sampling), and its weights end the
    same."""
    expected_weights, expected_evaluations = whole_run
    config = run_config(tmp_path, tiny_model, enable_progress_bar=True, callbacks=[
        signal_at, responses_to(tmp_path / "responses")], **length)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--ckpt_path", "last"])
    assert stopped.value.code == 143
    step = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert step not in evaluations(tmp_path / "responses")
    capsys.readouterr()
    resumed = main(["fit", "--config", str(config), "--ckpt_path", "last"])
    progress = [line for line in capsys.readouterr().out.splitlines() if "] step " in line]
    assert f"] step {step}/4  evaluation" in progress[0]  # before any training step
    assert evaluations(tmp_path / "responses") == expected_evaluations
    final = weights(resumed)
    assert all(torch.equal(final[k], expected_weights[k]) for k in expected_weights)


def test_a_requeued_run_keeps_one_last_checkpoint_when_the_signal_came_before_the_first_periodic_one(tmp_path,
                                                                                                     tiny_model):
    """SIGTERM at step 1, before the ModelCheckpoint's first save (every 3 steps): after the requeue its saves replace
    the signal's ``last.ckpt``, so the directory holds one checkpoint, not a stale one beside ``last-v1.ckpt``."""
    config = run_config(tmp_path, tiny_model, callbacks=[{"class_path": "helpers.SignalAt", "init_args": {"step": 0}}],
                        checkpoints={"every_n_train_steps": 3, "save_last": True, "save_top_k": 0})
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config), "--ckpt_path", "last"])
    assert stopped.value.code == 143
    main(["fit", "--config", str(config), "--ckpt_path", "last"])
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["last.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] >= 3


def test_two_fsdp2_ranks_stop_at_the_same_step_when_one_gets_the_signal(tmp_path, tiny_model):
    """Rank 1 alone is signalled during step 1 (as a scheduler that signals one node first): both ranks agree at
    that step's end, write one sharded ``last.ckpt`` together and exit 143; the requeue resumes from it. As a
    cluster runs it: the command in a subprocess, Lightning starting the second rank's process itself."""
    config = run_config(tmp_path, tiny_model, steps=3, callbacks=[
        {"class_path": "helpers.SignalAt", "init_args": {"step": 1, "rank": 1}}], devices=2, enable_progress_bar=True,
        strategy={"class_path": "evolrl.distributed.ModelParallelStrategy",
                  "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1}})
    config.write_text(config.read_text().replace("prompts_per_step: 2", "prompts_per_step: 1"))
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "PYTHONPATH": str(ROOT / "tests")}
    command = [sys.executable, "-m", "evolrl", "fit", "--config", str(config), "--ckpt_path", "last"]
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 143, first.stdout[-2000:] + first.stderr[-3000:]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert "SIGTERM received, stopping at step 2, signalled on another rank: saved" in first.stdout
    assert (last / "meta.pt").is_file()
    assert torch.load(last / "meta.pt", weights_only=True)["global_step"] == 2
    requeue = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert requeue.returncode == 0, requeue.stdout[-2000:] + requeue.stderr[-3000:]
    assert f"resuming from {last} (step 2)" in requeue.stdout and "] step 3/3  " in requeue.stdout


def test_sigusr1_exits_138(tmp_path, tiny_model):
    config = run_config(tmp_path, tiny_model, steps=2,
                        callbacks=[{"class_path": "helpers.SignalAt", "init_args": {"step": 0, "signum": 10}}])
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    assert stopped.value.code == 128 + signal.SIGUSR1
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1


def test_a_checkpoint_file_resumes_with_the_settings_given_now_and_lists_them(tmp_path, tiny_model, capsys):
    config = run_config(tmp_path, tiny_model, steps=2, checkpoints={"filename": "{step}", "save_top_k": -1,
                                                                     "every_n_train_steps": 1})
    main(["fit", "--config", str(config)])
    first = tmp_path / "checkpoints" / "step=1.ckpt"
    capsys.readouterr()
    cli = main(["fit", "--config", str(config), "--ckpt_path", str(first), "--model.loss.entropy_coef=0.5",
                "--model.batching.micro_batch_size=1"])
    out = capsys.readouterr().out
    assert f"resuming from {first} (step 1); 2 setting(s) differ from the checkpoint's, the new value is used:" in out
    assert "  model.batching.micro_batch_size: 2 -> 1" in out and "  model.loss.entropy_coef: 0.003 -> 0.5" in out
    assert cli.model.update.loss.entropy_coef == 0.5 and cli.model.update.batching.micro_batch_size == 1
    assert cli.trainer.global_step == 2


def test_resuming_with_another_model_is_refused_naming_the_setting(tmp_path, tiny_model, capsys):
    config = run_config(tmp_path, tiny_model, steps=1)
    main(["fit", "--config", str(config)])
    other = str(make_tiny_model(tmp_path / "other", seed=1))
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    with pytest.raises(SystemExit) as refused:
        main(["fit", "--config", str(config), "--ckpt_path", str(checkpoint), f"--model.model={other}"])
    assert refused.value.code == 2
    assert f"model.model='{other}' cannot resume {checkpoint}, saved with model.model='{tiny_model}'" in \
        capsys.readouterr().err


def test_changed_training_prompts_are_refused_unless_allowed(tmp_path, tiny_model):
    config = run_config(tmp_path, tiny_model, steps=1)
    main(["fit", "--config", str(config)])
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    more = ["--data.train.init_args.count=10", "--trainer.max_epochs=2", "--ckpt_path", str(checkpoint)]
    with pytest.raises(DataError, match="the training prompts differ from those the checkpoint was trained on"):
        main(["fit", "--config", str(config), *more])
    assert main(["fit", "--config", str(config), *more, "--data.allow_changed_prompts=true"]).trainer.global_step == 2


def test_an_unreadable_checkpoint_is_named(tmp_path, tiny_model, capsys):
    config = run_config(tmp_path, tiny_model, steps=1)
    main(["fit", "--config", str(config)])
    (checkpoint,) = (tmp_path / "checkpoints").glob("*.ckpt")
    checkpoint.write_bytes(checkpoint.read_bytes()[:100_000])  # as a copy cut short leaves it
    with pytest.raises(SystemExit, match=rf"evolrl: error: checkpoint {checkpoint} cannot be read"):
        main(["fit", "--config", str(config), "--ckpt_path", str(checkpoint)])


def test_a_nan_reward_stops_the_run_naming_it_and_keeps_the_last_checkpoint(tmp_path, tiny_model):
    config = run_config(tmp_path, tiny_model, steps=3, checkpoints={"filename": "{step}", "save_top_k": -1,
                                                                     "every_n_train_steps": 1})
    with pytest.raises(SystemExit, match=r"evolrl: error: NaNAfter gave 3 of the 6 trained responses a non-finite "
                                         r"reward \(NaN or inf\) at step 1 \(groups \[0\]\); the checkpoints saved so "
                                         r"far are kept"):
        main(["fit", "--config", str(config), "--model.reward=helpers.NaNAfter", "--model.reward.calls=2"])
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["step=1.ckpt"] and torch.load(tmp_path / "checkpoints" / saved[0], weights_only=True)


def test_consecutive_skipped_steps_stop_the_update_past_the_setting(tiny_model):
    from helpers import mixed_sequences

    from evolrl.models import load_policy

    policy = load_policy(tiny_model)
    seqs = mixed_sequences(vocab=300)
    seqs = type(seqs)(seqs.input_ids, seqs.attention_mask, response_mask=seqs.response_mask,
                      advantages=torch.full_like(seqs.advantages, float("nan")))
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.0), Batching(mini_batch_size=2, micro_batch_size=2), max_grad_norm=1.0,
                        max_consecutive_skips=2)
    with pytest.raises(TrainingStopped, match=r"3 optimizer steps in a row had a non-finite gradient norm .*"
                                              r"Optimization.max_consecutive_skips=2"):
        update(policy, None, seqs, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
    assert update.skipped_steps == 3


def test_a_second_run_on_a_directory_in_use_is_refused(tmp_path, tiny_model):
    config = run_config(tmp_path, tiny_model, steps=1)
    held = RunLock(tmp_path / "checkpoints")
    held.acquire()  # a live run
    try:
        with pytest.raises(SystemExit, match=rf"evolrl: error: the checkpoint directory {tmp_path / 'checkpoints'} "
                                             r"is in use by another run \(pid \d+ on .*\): give this run its own "
                                             r"trainer.default_root_dir"):
            main(["fit", "--config", str(config)])
    finally:
        held.release()
    assert main(["fit", "--config", str(config)]).trainer.global_step == 1  # free once that run is gone


def test_a_checkpoint_directory_that_cannot_be_written_stops_fit_at_start(tmp_path, tiny_model):
    (tmp_path / "a-file").write_text("")
    config = run_config(tmp_path, tiny_model, steps=1, default_root_dir=str(tmp_path / "a-file" / "run"))
    with pytest.raises(SystemExit, match=r"the checkpoint directory .*a-file/run/checkpoints cannot be written"):
        main(["fit", "--config", str(config)])


def test_a_lora_target_the_model_lacks_is_a_usage_error(tmp_path, tiny_model, capsys):
    config = run_config(tmp_path, tiny_model, steps=1)
    with pytest.raises(SystemExit) as usage:
        main(["fit", "--config", str(config), "--model.lora.target_modules=[nope]"])
    assert usage.value.code == 2
    assert "LoRA.target_modules=['nope'] is not allowed" in capsys.readouterr().err


def mounted_tmpfs(directory: Path, size: int) -> bool:
    directory.mkdir(parents=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True).returncode == 0


def test_a_full_filesystem_leaves_no_truncated_checkpoint(tmp_path, tiny_model):
    """The checkpoint directory on a tmpfs with room for one checkpoint and a half: the second save fails, the run
    stops naming it, and every ``.ckpt`` left there loads (``$TMPDIR`` is on another filesystem, as on a cluster)."""
    config = run_config(tmp_path, tiny_model, steps=3, checkpoints={"filename": "{step}", "save_top_k": -1,
                                                                     "every_n_train_steps": 1})
    main(["fit", "--config", str(config), "--trainer.max_steps=1", "--trainer.default_root_dir", str(tmp_path / "m")])
    size = (tmp_path / "m" / "checkpoints" / "step=1.ckpt").stat().st_size
    disk = tmp_path / "disk"
    if not mounted_tmpfs(disk, size * 3 // 2):
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
    try:
        with pytest.raises(SystemExit, match=rf"could not write the checkpoint {disk}/checkpoints/step=2.ckpt: "
                                             r"No space left on device; no file was left under that name"):
            main(["fit", "--config", str(config), "--trainer.default_root_dir", str(disk)])
        left = sorted(p.name for p in (disk / "checkpoints").iterdir())
        assert left == ["step=1.ckpt"]
        assert torch.load(disk / "checkpoints" / "step=1.ckpt", weights_only=True)["global_step"] == 1
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_without_a_terminal_progress_comes_as_lines(tmp_path, tiny_model):
    """stdout to a file, as SLURM's --output: a line per step (log_every_n_steps: 1) and one per evaluation."""
    config = run_config(tmp_path, tiny_model, steps=3, enable_progress_bar=True)
    with open(tmp_path / "job.out", "w") as out:
        subprocess.run([sys.executable, "-m", "evolrl", "fit", "--config", str(config)], stdout=out,
                       stderr=subprocess.STDOUT, cwd=ROOT, check=True, timeout=300)
    log = (tmp_path / "job.out").read_text()
    for step in (1, 2, 3):
        assert f"] step {step}/3  " in log and f"] step {step}/3  evaluation  addition pass@1 " in log, log
    assert "] before training:  addition pass@1 " in log
    assert "reward " in log and "entropy " in log and "s/step" in log
    assert "Loading weights" not in log and "it/s]" not in log  # no library's progress-bar frames in a log file
