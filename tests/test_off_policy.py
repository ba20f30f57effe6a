"""Off-policy rollouts (``data.max_staleness``) and a sampler process of its own (``data.sampler_process``).

Runs go through ``python -m evolrl fit`` (in this process, or in a subprocess where one is killed) on the tiny model
with the Hugging Face engine reporting its log-probs. The lag is read from the TensorBoard curves the run wrote.
Exact resume compares weights with ``torch.equal`` between runs in processes started the same way on this machine,
as the other resume tests do; nothing compares sampled values across machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import Recorder, fit, scalars, tiny_config

from evolrl.algorithms import TokenTruncate
from evolrl.cli import main
from evolrl.logprobs import trained_sequences
from evolrl.models import load_policy
from evolrl.rollout import HFEngine
from evolrl.rollout.remote import SamplerPlacement, check_placement
from evolrl.settings import SettingError
from evolrl.training import GRPOLoss, Optimization

ROOT = Path(__file__).parent.parent
LAUNCHER = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")


@pytest.fixture(autouse=True)
def plain_argv(monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])


def lag_config(tmp_path: Path, model: str, k: int, steps: int = 5, process: dict | None = None, evaluate=False,
               callbacks=(), checkpoints: bool = False, **data) -> Path:
    """The tiny run for ``steps`` steps at ``max_staleness`` k, with a sampler process when ``process`` is given."""
    path = tiny_config(tmp_path, model, steps=steps, reward="MajorityVoteReward")
    config = yaml.safe_load(path.read_text())
    config["trainer"] |= {"max_epochs": -1, "max_steps": steps, "limit_train_batches": None}
    if not evaluate:
        config["trainer"] |= {"limit_val_batches": 0, "num_sanity_val_steps": 0}
    config["trainer"]["callbacks"] += list(callbacks)
    if checkpoints:
        config["trainer"]["enable_checkpointing"] = True
        config["trainer"]["callbacks"].append({"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {
            "every_n_train_steps": 1, "save_last": True, "save_top_k": 0}})
    config["model"]["loss"] = {"mismatch_correction": {"class_path": "evolrl.algorithms.TokenTruncate"}}
    config["data"] |= {"engine": {"class_path": "evolrl.rollout.HFEngine", "init_args": {"report_logprobs": True}},
                       "max_staleness": k, **data}
    if process is not None:
        config["data"]["sampler_process"] = process
    path.write_text(yaml.safe_dump(config))
    return path


def lags(tmp_path: Path) -> list[float]:
    return scalars(tmp_path / "tiny")["train/lag"]


@pytest.mark.parametrize("k", [1, 2])
def test_each_batch_lags_at_most_k_versions_and_exactly_k_after_the_first_k_steps(tmp_path, tiny_model, k):
    main(["fit", "--config", str(lag_config(tmp_path, tiny_model, k))])
    assert lags(tmp_path) == [min(step, k) for step in range(5)]


def test_the_default_stays_on_policy(tmp_path, tiny_model):
    main(["fit", "--config", str(lag_config(tmp_path, tiny_model, 0, steps=3))])
    assert lags(tmp_path) == [0.0, 0.0, 0.0]


def test_a_sampler_process_lags_the_same_and_logs_the_waits(tmp_path, tiny_model):
    """The sampler on core 1 (the trainer keeps the others), sampling while the trainer updates; the evaluation
    after every step goes through it too."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: one for the sampler, one for the trainer")
    config = lag_config(tmp_path, tiny_model, 1, steps=3, process={"cpus": [str(cores[-1])]}, evaluate=True)
    main(["fit", "--config", str(config)])
    curves = scalars(tmp_path / "tiny")
    assert curves["train/lag"] == [0.0, 1.0, 1.0]
    assert len(curves["time/rollout_wait"]) == len(curves["time/sampler_idle"]) == 3
    assert all(t >= 0 for t in curves["time/rollout_wait"] + curves["time/sampler_idle"])
    assert any(tag.startswith("val/") and "pass@" in tag for tag in curves)
    assert os.sched_getaffinity(0) == set(cores)  # given back when the run ended


def test_on_policy_in_a_sampler_process_samples_with_the_trainer_s_weights(tmp_path, tiny_model):
    """At k=0 the sampler process's reported log-probs are the trainer's own for the same weights: the pushed weights
    arrived whole (a wrong tensor would move them by far more than generate's incremental decoding does, ~1e-6)."""
    main(["fit", "--config", str(lag_config(tmp_path, tiny_model, 0, steps=2, process={}))])
    curves = scalars(tmp_path / "tiny")
    assert max(curves["mismatch/gap_max"]) < 1e-3


def test_a_lora_policy_reaches_the_sampler_process_merged(tmp_path, tiny_model):
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    config = lag_config(tmp_path, tiny_model, 0, steps=2, process={})
    settings = yaml.safe_load(config.read_text())
    settings["model"] |= {"lora": lora, "optim": {"lr": 0.05}}  # adapters that move the weights at once
    config.write_text(yaml.safe_dump(settings))
    main(["fit", "--config", str(config)])
    curves = scalars(tmp_path / "tiny")
    assert max(curves["mismatch/gap_max"]) < 1e-3


def test_dynamic_sampling_takes_its_further_rounds_from_the_line(tmp_path, tiny_model):
    config = lag_config(tmp_path, tiny_model, 1, steps=4, dynamic_sampling={"max_rounds": 3})
    main(["fit", "--config", str(config)])
    curves = scalars(tmp_path / "tiny")
    assert all(0 <= lag <= 1 for lag in curves["train/lag"]) and len(curves["train/lag"]) == 4
    assert max(curves["train/dynamic_sampling/rounds"]) >= 1


class BehaviourCapture(Recorder):
    """The rollouts of each step and the policy's weights as the step began."""

    def __init__(self):
        super().__init__()
        self.batches, self.at_start = [], []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.at_start.append({k: v.detach().clone() for k, v in module.policy.state_dict().items()})

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)
        self.batches.append(outputs["rollouts"])


def token_logprobs(model, seqs, temperature: float) -> torch.Tensor:
    logits = model(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask).logits[:, :-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, seqs.input_ids[:, 1:, None]).squeeze(-1)


def test_the_importance_weights_use_the_behaviour_policy_s_log_probs(tiny_model):
    """Known answer: step 1 trains on a batch sampled with the initial weights (version 0). Its reported log-probs
    are those weights' log-probs of the tokens (tolerance 1e-4: generate decodes incrementally, the check scores the
    whole sequence, both in float32), not the step's own policy's, and the loss weighs each token by
    ``min(exp(old - behaviour), cap)`` with ``old`` the step's policy."""
    capture = BehaviourCapture()
    cap = 1.5
    module, _, _ = fit(tiny_model, steps=2, callbacks=[capture], engine=HFEngine(report_logprobs=True),
                       max_staleness=1, module_kwargs={
                           "loss": GRPOLoss(mismatch_correction=TokenTruncate(cap=cap)),
                           "optim": Optimization(lr=0.05)})
    assert capture.versions == [0, 0]
    batch = capture.batches[1]
    seqs = trained_sequences(batch, torch.zeros(batch.trained.shape), 0)
    model = load_policy(tiny_model)
    model.load_state_dict(capture.before)  # version 0: the behaviour policy
    mask = seqs.response_mask
    with torch.no_grad():
        behaviour = token_logprobs(model, seqs, batch.temperature)
        model.load_state_dict(capture.at_start[1])  # the policy as step 1 began
        old = token_logprobs(model, seqs, batch.temperature)
    reported = seqs.sampler_logprobs
    assert (reported - behaviour)[mask].abs().max() < 1e-4
    assert (old - behaviour)[mask].abs().max() > 1e-2  # the step's policy is another one
    weights, _ = module.update.loss.correct(old, seqs)
    expected = torch.exp(old - reported).clamp(max=cap)
    assert torch.allclose(weights[mask], expected[mask], atol=1e-6)


def run(command, **kwargs) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER}, "PYTHONPATH": str(ROOT / "tests")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **kwargs)


def test_kill_9_and_resume_ends_with_the_weights_of_an_uninterrupted_run(tmp_path, tiny_model):
    """The queued batches, sampled with versions the resumed run no longer has, travel in the checkpoint."""
    fit_cmd = [sys.executable, "-m", "evolrl", "fit", "--ckpt_path", "last", "--config"]
    whole = lag_config(tmp_path / "whole", tiny_model, 1, steps=5, process={}, checkpoints=True)
    assert run([*fit_cmd, str(whole)]).returncode == 0
    cut = lag_config(tmp_path / "cut", tiny_model, 1, steps=5, process={}, checkpoints=True,
                     callbacks=[{"class_path": "helpers.SignalAt", "init_args": {"step": 3, "signum": 9}}])
    killed = run([*fit_cmd, str(cut)])
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert torch.load(tmp_path / "cut" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    lag_config(tmp_path / "cut", tiny_model, 1, steps=5, process={}, checkpoints=True)  # the requeue, unsignalled
    resumed = run([*fit_cmd, str(cut)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, final = (torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=True) for d in ("whole", "cut"))
    assert final["global_step"] == expected["global_step"] == 5
    assert all(torch.equal(final["state_dict"][k], v) for k, v in expected["state_dict"].items())


def test_a_sigterm_to_the_whole_job_saves_through_the_sampler_and_the_requeue_finishes(tmp_path, tiny_model):
    """As a scheduler preempts: SIGTERM to the process group, sampler included. The sampler ignores it, so the
    trainer finishes the step, saves (the queued batch with it) and exits 143; the requeue runs to the end."""
    config = lag_config(tmp_path, tiny_model, 1, steps=4, process={}, checkpoints=True, callbacks=[
        {"class_path": "helpers.SignalAt", "init_args": {"step": 2, "group": True}}])
    command = [sys.executable, "-m", "evolrl", "fit", "--config", str(config), "--ckpt_path", "last"]
    first = run(command, start_new_session=True)
    assert first.returncode == 143, first.stdout[-2000:] + first.stderr[-3000:]
    assert "SIGTERM received, stopping at step 3" in first.stdout
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(saved["RolloutDataModule"]["rollouts"]["queues"][0]) == 1  # the queued batch, sampled
    requeue = run(command, start_new_session=True)
    assert requeue.returncode == 0, requeue.stdout[-2000:] + requeue.stderr[-3000:]
    assert "resuming from" in requeue.stdout


def test_a_killed_sampler_stops_the_run_naming_it_within_a_minute(tmp_path, tiny_model, capsys):
    config = lag_config(tmp_path, tiny_model, 1, steps=4, process={},
                        callbacks=[{"class_path": "helpers.SignalSampler", "init_args": {"step": 1}}])
    start = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    assert time.monotonic() - start < 60
    message = str(stopped.value.code)
    assert message.startswith("evolrl: error: the sampler process of rank 0 (pid ") and "exited with code -9" in message


def test_a_hanging_sampler_stops_the_run_after_its_timeout(tmp_path, tiny_model):
    config = lag_config(tmp_path, tiny_model, 1, steps=4, process={"timeout_s": 5},
                        callbacks=[{"class_path": "helpers.SignalSampler", "init_args": {"step": 1, "signum": 19}}])
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    assert "answered nothing for 5 s (data.sampler_process.timeout_s)" in str(stopped.value.code)


def fsdp_config(tmp_path: Path, model: str, process: dict | None = {}, **kwargs) -> Path:  # noqa: B006 (read only)
    config = lag_config(tmp_path, model, 1, process=process, **kwargs)
    settings = yaml.safe_load(config.read_text())
    settings["trainer"] |= {"devices": 2, "strategy": {"class_path": "evolrl.distributed.ModelParallelStrategy",
                                                      "init_args": {"data_parallel_size": 2, "tensor_parallel_size": 1}}}
    settings["data"]["prompts_per_step"] = 1
    config.write_text(yaml.safe_dump(settings))
    return config


def test_two_fsdp2_ranks_each_train_with_a_sampler_process_of_their_own(tmp_path, tiny_model):
    done = run([sys.executable, "-m", "evolrl", "fit", "--config", str(fsdp_config(tmp_path, tiny_model, steps=3))])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert lags(tmp_path) == [0.0, 1.0, 1.0]


def test_two_ranks_resume_each_with_its_own_queued_batches(tmp_path, tiny_model):
    """A checkpoint is written from rank 0's state: it must hold every rank's line. Preempted at step 2 and requeued,
    the two ranks go on as the uninterrupted run: its losses at the steps after the resume are the same (each rank
    trains its own queued prompts; rank 1 on rank 0's would change the step's gradient)."""
    def losses(directory: Path, signal_at: int | None) -> list[float]:
        callbacks = [] if signal_at is None else [{"class_path": "helpers.SignalAt", "init_args": {"step": signal_at}}]
        config = fsdp_config(directory, tiny_model, steps=5, callbacks=callbacks, process=None)
        settings = yaml.safe_load(config.read_text())
        settings["trainer"]["enable_checkpointing"] = True
        config.write_text(yaml.safe_dump(settings))
        command = [sys.executable, "-m", "evolrl", "fit", "--config", str(config), "--ckpt_path", "last"]
        first = run(command)
        if signal_at is not None:
            assert first.returncode == 143, first.stderr[-3000:]
            first = run(command)
        assert first.returncode == 0, first.stderr[-3000:]
        files = sorted((directory / "tiny").rglob("events.out.tfevents.*"))
        return [value for f in files for value in scalars(f.parent)["train/loss"]][-2:]

    assert losses(tmp_path / "cut", signal_at=2) == losses(tmp_path / "whole", signal_at=None)


def test_a_killed_sampler_of_one_rank_stops_both_ranks(tmp_path, tiny_model):
    config = fsdp_config(tmp_path, tiny_model, steps=4, callbacks=[
        {"class_path": "helpers.SignalSampler", "init_args": {"step": 1, "rank": 1}}])
    start = time.monotonic()
    stopped = run([sys.executable, "-m", "evolrl", "fit", "--config", str(config)])
    assert time.monotonic() - start < 120  # two ranks start in that time; the failure itself is seconds
    assert stopped.returncode == 1, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert "evolrl: error: sampler process failed on rank 1" in stopped.stderr
    assert "the sampler process of rank 1 (pid " in stopped.stderr


@pytest.mark.parametrize(("data", "named"), [
    ({"max_staleness": -1}, "RolloutDataModule.max_staleness=-1"),
    ({"max_staleness": 1, "engine": {"class_path": "evolrl.rollout.HFEngine"}},
     "data.max_staleness=1 is not allowed: 0 with HFEngine, which does not report the log-probs"),
    ({"sampler_process": {"cpus": ["0", "0"]}}, "data.sampler_process.cpus"),
])
def test_bad_settings_stop_fit_at_start_naming_them(tmp_path, tiny_model, capsys, data, named):
    config = lag_config(tmp_path, tiny_model, 0, **data)
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(config)])
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


def test_off_policy_without_a_correction_is_refused_naming_it(tmp_path, tiny_model, capsys):
    config = lag_config(tmp_path, tiny_model, 1)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--model.loss.mismatch_correction", "null"])
    assert "model.loss.mismatch_correction=None is not allowed: a correction with data.max_staleness=1" in (
        capsys.readouterr().err)


def test_a_sampler_on_every_core_or_on_a_trainer_gpu_is_refused(tmp_path, tiny_model, capsys):
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(lag_config(tmp_path, tiny_model, 1, process={"cpus": [every]}))])
    err = capsys.readouterr().err
    assert "data.sampler_process.cpus" in err and "leaving the trainer at least one" in err
    with pytest.raises(SettingError, match=r"data.sampler_process.cuda_devices=\[1\] is not allowed: GPUs the trainer "
                                           r"does not use \(it trains on \[0, 1\]; shared: \[1\]\)"):
        check_placement(SamplerPlacement(cuda_devices=(1,)), 1, trainer_devices=[0, 1])
    with pytest.raises(SettingError, match="one entry per training rank"):
        check_placement(SamplerPlacement(cuda_devices=(2,)), 2, trainer_devices=[0, 1])
    with pytest.raises(SettingError, match=r"cuda_devices=\[0\] is not allowed: \[\] when training on CPUs"):
        check_placement(SamplerPlacement(cuda_devices=(0,)), 1, trainer_devices=None)


def _receiving_end(conn, port: int, device: str) -> None:
    from evolrl.rollout.remote.channel import SamplerEnd

    end = SamplerEnd(port, torch.device(device), timeout_s=60)
    for _ in range(2):  # two pushes: the second into the kept buffers, one of them reshaped
        conn.send([(name, float(t.double().sum()), tuple(t.shape), str(t.dtype)) for name, t in end.receive(conn.recv)])


def pushed_through_the_channel(device: str, sampler_device: str) -> None:
    import torch.multiprocessing as mp

    from evolrl.rollout.remote.channel import TrainerEnd

    trainer = TrainerEnd(torch.device(device), timeout_s=60)
    context = mp.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=_receiving_end, args=(child, trainer.port, sampler_device), daemon=True)
    process.start()
    trainer.connect()
    for push in range(2):
        tensors = {"embed.weight": torch.randn(50, 8 + push), "norm.weight": torch.arange(8.0).to(torch.bfloat16)}
        sent = trainer.send(iter(tensors.items()), conn.send)
        assert sent == sum(t.numel() * t.element_size() for t in tensors.values())
        received = conn.recv()
        assert [(n, s, d) for n, _, s, d in received] == [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors.items()]
        assert all(total == float(tensors[name].double().sum()) for name, total, _, _ in received)
    process.join(30)
    assert process.exitcode == 0


def test_the_gloo_channel_moves_named_tensors_whole():
    """Two pushes through the CPU channel, in float32 and bfloat16, the second reshaping one tensor: every tensor
    arrives with its name, shape, dtype and exact values (a broadcast copies bytes: the sums agree exactly)."""
    pushed_through_the_channel("cpu", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between two processes needs two GPUs")
def test_the_nccl_channel_moves_named_tensors_whole():
    pushed_through_the_channel("cuda:0", "cuda:1")
