"""What the tests share (pytest puts tests/ and the repository root on the path: pyproject's ``pythonpath``).

* Models: :func:`make_tiny_model`, a tiny random Llama with a real (small) BPE tokenizer and a ChatML template, built
  from a config and loaded through the same ``from_pretrained`` path a user's model takes (a 300-token vocabulary
  keeps a training step in milliseconds); :func:`tied_qwen3`, a tiny Qwen3 with tied embeddings (as Qwen3-4B).
* Runs: :func:`tiny_config` (a two-step CLI run), :func:`fit` (the module and data module through a Trainer),
  :func:`scalars` (the TensorBoard curves a run wrote), :class:`Recorder`, :class:`StreamingDataModule` (training data
  without a length).
* Updates without a trainer: :func:`mixed_sequences`, :func:`short_sequences`, :func:`run_update`.
* :class:`ForeignRL`: a Lightning module that is not evolrl's, with its own output format, and its views.
"""

from __future__ import annotations

import glob
import os
import socket
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path, PurePosixPath

import lightning as L
import torch
import torch.distributed as dist
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch.utils.data import DataLoader
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from evolrl.callbacks import EvalView, TrainView
from evolrl.data import AdditionPrompts, RolloutDataModule
from evolrl.logprobs.from_logits import logprobs_and_entropy
from evolrl.logprobs.sequences import Sequences
from evolrl.models import load_policy, load_tokenizer
from evolrl.rewards import MajorityVoteReward, group_answers, majority_class
from evolrl.rollout import HFEngine, Sampling
from evolrl.rollout.engine import RolloutEngine
from evolrl.training import Batching, EvolRLModule, GRPOLoss, GRPOUpdate
from evolrl.types import Prompt, ResponseGroup, RewardOutput, RolloutBatch

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "What is 3 + 4? The answer is 7.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "We add the numbers: 1 + 2 = 3, so the result is \\boxed{3}.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18",
    "system user assistant question answer sum plus equals",
] * 20


def make_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write a tiny Llama and its tokenizer to ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(directory)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # stop often (about one token in five), so response lengths vary
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 4.0
    model.save_pretrained(directory)
    return directory


def tied_qwen3(directory, tokenizer_from: str, max_positions: int = 512, sharp: bool = False):
    """A tiny random Qwen3 with tied input and output embeddings (as Qwen3-4B), with the tiny model's tokenizer.

    ``sharp``: attention scores scaled up (the q/k norms' weights x4, scores x16) and a peaked output layer, so
    that attention picks out positions (random weights otherwise attend almost uniformly, and a wrong rotary angle
    would change little) and the log-probs are far from uniform, as a trained model's.
    """
    tokenizer = load_tokenizer(tokenizer_from)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=max_positions,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = Qwen3ForCausalLM(config)
    if sharp:
        with torch.no_grad():
            model.lm_head.weight.mul_(8)
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.mul_(4)
                layer.self_attn.k_norm.weight.mul_(4)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def tiny_config(tmp_path: Path, model: str, steps: int = 2, reward: str = "EvolReward", **model_overrides) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "max_epochs": 1, "limit_train_batches": steps, "log_every_n_steps": 1,
            "default_root_dir": str(tmp_path),
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "val_check_interval": 1, "num_sanity_val_steps": -1,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path), "name": "tiny"}},
            "callbacks": [{"class_path": "evolrl.callbacks.PassAtK",
                           "init_args": {"pass_ks": [1, 4], "maj_ks": [4]}}],
        },
        "model": {
            "model": model,
            "reward": {"class_path": f"evolrl.rewards.{reward}",
                       "init_args": {"answers": {"valid_rule": "any", "number_fallback": True}}},
            "batching": {"mini_batch_size": 4, "micro_batch_size": 2}, "optim": {"lr": 1e-3}, **model_overrides,
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


def build_config(tmp_path: Path, model: str, trainer: dict | None = None, **top) -> Path:
    """The least ``evolrl.cli.main(..., run=False)`` builds from: one prompt a step, the Hugging Face engine, no
    logger or checkpoints; ``trainer`` settings and top-level keys (e.g. ``seed_everything``) on top."""
    config = {
        "trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "enable_checkpointing": False,
                    "enable_progress_bar": False, "enable_model_summary": False, **(trainer or {})},
        "model": {"model": model, "batching": {"mini_batch_size": 2, "micro_batch_size": 2}},
        "data": {"train": {"class_path": "evolrl.data.AdditionPrompts", "init_args": {"count": 4}},
                 "engine": {"class_path": "evolrl.rollout.HFEngine"},
                 "prompts_per_step": 1, "vote_samples": 2, "trained_samples": 2},
        **top,
    }
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def scalars(log_dir: Path) -> dict[str, list[float]]:
    files = glob.glob(str(log_dir / "**" / "events.out.tfevents.*"), recursive=True)
    assert files, f"no TensorBoard event file under {log_dir}"
    events = EventAccumulator(files[0])
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


class Recorder(L.Callback):
    def __init__(self):
        self.versions, self.losses = [], []

    def on_train_start(self, trainer, module):
        self.before = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.versions.append(outputs["rollouts"].weights_version)
        self.losses.append(outputs["stats"]["loss"])


def fit_checkpointed(module, data, directory, recorder: Recorder, ckpt_path=None, **trainer_kwargs) -> Recorder:
    """``module`` trained on ``data`` on the CPU with a checkpoint after every step (``directory/step=N.ckpt``), from
    ``ckpt_path`` when given; ``trainer_kwargs``: the run's length (``max_epochs``, ``max_steps``)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = ModelCheckpoint(dirpath=directory, filename="{step}", every_n_train_steps=1, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[recorder, checkpoints], **trainer_kwargs)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return recorder


BATCHING = {f.name for f in fields(Batching)}


def fit(model_dir: str, steps: int = 1, module_kwargs=None, datamodule_cls=RolloutDataModule, callbacks=(),
        trainer_kwargs=None, **data_kwargs):
    kwargs = {"reward": MajorityVoteReward(), **(module_kwargs or {})}  # Batching's fields by name too
    batching = {"mini_batch_size": 6, "micro_batch_size": 2} | {k: kwargs.pop(k) for k in BATCHING & set(kwargs)}
    module = EvolRLModule(model_dir, batching=Batching(**batching), **kwargs)
    data = datamodule_cls(AdditionPrompts(count=8), model=model_dir, **{
        "engine": HFEngine(), "prompts_per_step": 2, "vote_samples": 4, "trained_samples": 3,
        "sampling": Sampling(max_new_tokens=6),
        **data_kwargs})
    recorder = Recorder()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[recorder, *callbacks], **(trainer_kwargs or {}))
    trainer.fit(module, data)
    return module, data, recorder


class Unsized:
    """A loader without ``len``, like a streaming data set: Lightning then prefetches one batch ahead."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


class StreamingDataModule(RolloutDataModule):
    def train_dataloader(self):
        return Unsized(super().train_dataloader())


LENGTHS = [14, 6, 21, 9, 17, 7, 11, 25]  # prompt + response tokens per sequence


PROMPTS = [4, 3, 6, 4, 5, 3, 4, 6]


def mixed_sequences(vocab: int, lengths=LENGTHS, prompts=PROMPTS, seed: int = 0) -> Sequences:
    """Right-padded sequences of different lengths, random advantages."""
    generator = torch.Generator().manual_seed(seed)
    n, width = len(lengths), max(lengths)
    ids = torch.randint(3, vocab, (n, width), generator=generator)
    attention = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    ids[attention == 0] = 0  # padding
    response = torch.zeros(n, width - 1, dtype=torch.bool)
    for i, (length, prompt) in enumerate(zip(lengths, prompts)):
        response[i, prompt - 1 : length - 1] = True
    return Sequences(ids, attention, response_mask=response, advantages=torch.randn(n, generator=generator))


def logprobs_and_grads(model, logprobs, seqs: Sequences, device: str = "cpu", **options):
    """One pass of ``logprobs`` (``sequence_logprobs``, ``packed_logprobs``, ...) over ``seqs`` and its backward
    through a fixed random weighting: the log-probs, the entropies and every parameter's gradient."""
    seqs = seqs.to(device)
    weights = torch.randn(seqs.response_mask.shape, generator=torch.Generator().manual_seed(1)).to(device)
    model.zero_grad()
    logp, entropy = logprobs(model, seqs, temperature=0.7, chunk_size=16, **options)
    ((logp * weights + entropy) * seqs.response_mask).sum().backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(got, expected, mask, rtol: float = 1e-5, scale: float = 1e-6, zero_outside: bool = False) -> None:
    """Two :func:`logprobs_and_grads` results agree on ``mask``: values within ``rtol``, each gradient within
    ``scale`` of its tensor's largest entry (float32 passes that sum in another order differ by ~1e-6 of it);
    ``zero_outside``: ``got`` is 0 where nothing is scored."""
    (logp, entropy, grads), (expected_logp, expected_entropy, expected_grads) = got, expected
    torch.testing.assert_close(logp[mask], expected_logp[mask], rtol=rtol, atol=rtol)
    torch.testing.assert_close(entropy[mask], expected_entropy[mask], rtol=rtol, atol=rtol)
    if zero_outside:
        assert (logp[~mask] == 0).all() and (entropy[~mask] == 0).all()
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=rtol, atol=scale * float(grad.abs().max()), msg=name)


def run_update(tiny_model, seqs, plan_wrapper=None, loss=None, **settings) -> tuple[list, dict, dict]:
    """One training step on ``seqs`` (2 mini-batches, KL to the reference) with SGD, whose parameters are linear
    in the gradients and so compare as tightly: ``(plan, stats, parameters)``."""
    policy = load_policy(tiny_model)
    reference = load_policy(tiny_model).eval().requires_grad_(False)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.05, **(loss or {})),
                        Batching(**{"mini_batch_size": 4, "logprob_chunk_size": 16, **settings}), max_grad_norm=1.0)
    if plan_wrapper is not None:
        update.plan = plan_wrapper(update.plan)
    stats = update(policy, reference, seqs, temperature=0.7, optimizer=optimizer, scheduler=scheduler)
    return update.plan(seqs), stats, {n: p.detach().clone() for n, p in policy.named_parameters()}


def short_sequences(vocab: int, advantages: list[float]) -> Sequences:
    generator = torch.Generator().manual_seed(0)
    n = len(advantages)
    ids = torch.randint(3, vocab, (n, 10), generator=generator)
    attention = torch.ones_like(ids)
    attention[1, 8:] = 0  # a shorter row
    response = torch.zeros(n, 9, dtype=torch.bool)
    response[:, 3:] = True
    response[1, 7:] = False
    return Sequences(ids, attention, response_mask=response, advantages=torch.tensor(advantages))


class ForeignRL(L.LightningModule):
    """Not evolrl's module: a toy with its own output format."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        loss = (self.w - 1.0).pow(2).sum()
        rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
        return {
            "loss": loss,
            "my_rewards": RewardOutput(
                rewards=rewards,
                answers=(("4", "5", "4", "4"), ("2", "2", "2", "2")),
                labels=("4", "2"),
                components={"majority": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]]).bool(),
                            "valid": torch.ones(2, 4, dtype=torch.bool),
                            "answer_class": torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0]])},
            ),
            "groups": RolloutBatch(tuple(
                ResponseGroup(Prompt(f"p{i}", f"question {i}", answer=truth), ("a | b", "c", "d", "e"))
                for i, truth in enumerate(["4", "3"])
            )),
            "token_entropy": 0.25 * (batch_idx + 1),
            "lengths": torch.tensor([10.0, 20.0, 30.0, 40.0]) * (batch_idx + 1),
            "hit_limit": torch.tensor([False, False, False, True]),
            "step": self.global_step,  # the 0-based index of this training step (before its optimizer step)
        }

    def validation_step(self, batch, batch_idx):
        # two problems per batch, 4 samples each
        return {"answers": [["1", "1", "2", "3"], ["7", "8", "8", "9"]],
                "correct": [[True, True, False, False], [False, True, True, False]]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(range(2), batch_size=1)

    def val_dataloader(self):
        return DataLoader(range(1), batch_size=1)


def train_view(outputs, batch):
    return TrainView(rewards=outputs["my_rewards"], rollouts=outputs["groups"], entropy=outputs["token_entropy"],
                     response_lengths=outputs["lengths"], truncated=outputs["hit_limit"], step=outputs["step"])


def eval_view(outputs, batch):
    return EvalView("toy", outputs["answers"], outputs["correct"])


def free_port() -> int:
    """A loopback port no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def one_process_group(backend: str):
    """A default process group of one rank, as vLLM or an NCCL strategy leaves on a single device."""
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def written_at(ids, stop, tokenizer) -> int:
    """The fewest of ``ids`` whose text contains ``stop``."""
    return next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k], skip_special_tokens=True))


def ends_at_its_stop_string(group, stop_strings, tokenizer, stops) -> int:
    """Every response of ``group`` that writes one of ``stop_strings`` ends with the token that completes it (kept,
    not truncated); the others end at a stop token or the limit. How many wrote one."""
    written = 0
    for ids, text, truncated in zip(group.response_ids, group.texts, group.truncated):
        hits = [t for t in stop_strings if t in text]
        if hits:
            written += 1
            assert min(written_at(list(ids), t, tokenizer) for t in hits) == len(ids) and not truncated, text
        else:
            assert truncated or ids[-1] in stops, text
    return written


def stops_where_written(engine, prompts, ids, tokenizer) -> None:
    """``engine`` sampled (seeded, replayable: the Hugging Face engine) with a stop string that its free responses
    write: each response that writes it is the free one cut where the string is first whole; one that never writes it
    is unchanged."""
    (free,) = engine.generate(prompts[:1], ids[:1], Sampling(max_new_tokens=24), n=4, seed=5)
    longest = max(range(4), key=lambda v: len(free.texts[v]))  # two characters from the middle of the longest
    stop = free.texts[longest][len(free.texts[longest]) // 2 :][:2]
    assert stop.strip(), free.texts
    (stopped,) = engine.generate(prompts[:1], ids[:1], Sampling(max_new_tokens=24, stop=(stop,)), n=4, seed=5)
    for v in range(4):
        before = list(free.response_ids[v])
        if stop in free.texts[v]:
            assert list(stopped.response_ids[v]) == before[: written_at(before, stop, tokenizer)]
        else:
            assert stopped.response_ids[v] == free.response_ids[v]
    assert ends_at_its_stop_string(stopped, (stop,), tokenizer, engine.stops()) >= 1


class SignalAt(L.Callback):
    """Sends this process ``signum`` as training step ``step`` starts (as a scheduler's SIGTERM would arrive); with
    ``rank``, only that rank's process; with ``group``, its whole process group (as SLURM signals a job step)."""

    def __init__(self, step: int, signum: int = 15, rank: int | None = None, group: bool = False) -> None:
        self.step, self.signum, self.rank, self.group = step, signum, rank, group

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            if self.group:
                os.killpg(os.getpgid(0), self.signum)
            else:
                os.kill(os.getpid(), self.signum)


class SignalInEvaluation(L.Callback):
    """Sends this process ``signum`` as the evaluation after training step ``step`` starts its first batch, in a run
    that started from nothing (a requeued run's evaluation of that step goes through)."""

    def __init__(self, step: int, signum: int = 15) -> None:
        self.step, self.signum = step, signum

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0) -> None:
        if (trainer.global_step, trainer.sanity_checking, batch_idx, trainer.ckpt_path) == (self.step, False, 0, None):
            os.kill(os.getpid(), self.signum)


class NaNAfter(MajorityVoteReward):
    """TTRL's reward, but NaN for the first group's responses from its ``calls``-th call on (a reward bug)."""

    def __init__(self, calls: int = 2) -> None:
        super().__init__()
        self.calls, self.seen = calls, 0

    def __call__(self, batch, context=None):
        output = super().__call__(batch, context)
        self.seen += 1
        if self.seen >= self.calls:
            output.rewards[0] = float("nan")
        return output


class SignalSampler(L.Callback):
    """Sends rank ``rank``'s sampler process (``data.sampler_process``) ``signum`` as training step ``step``
    starts: 9 kills it, 19 (SIGSTOP) leaves it hanging."""

    def __init__(self, step: int, signum: int = 9, rank: int = 0) -> None:
        self.step, self.signum, self.rank = step, signum, rank

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(trainer.datamodule.supply.remote.process.pid, self.signum)


@torch.no_grad()
def sampler_logprob_gap(engine: RolloutEngine, policy: torch.nn.Module, prompts: Sequence[Prompt],
                        prompt_ids: Sequence[Sequence[int]], sampling: Sampling, n: int = 4, seed: int = 1) -> float:
    """Does an engine sample from the policy it was handed? The largest |log-prob the engine reports for a token it
    samples now - the policy's log-prob of it|.

    About 1e-6 when the engine holds the policy's current weights (float32 on both sides); a stale
    or wrongly loaded engine is off by orders of magnitude more. ``n`` responses per prompt, seeded with
    ``seed``. The policy's side is scored as the trainer scores it, under ``softmax(logits / temperature)``;
    without top-p/top-k, since an engine renormalizes its log-probs over the tokens those keep.
    """
    if sampling.top_p != 1.0 or sampling.top_k != -1:
        raise ValueError(f"sampler_logprob_gap compares untruncated distributions: top_p 1 and top_k -1, got "
                         f"top_p {sampling.top_p}, top_k {sampling.top_k}")
    device = next(policy.parameters()).device
    gaps = []
    for group in engine.generate(prompts, prompt_ids, sampling=sampling, n=n, seed=seed):
        if not group.sampler_logprobs:
            raise ValueError(f"{type(engine).__name__} does not report the log-probs of the tokens it samples")
        for response, reported in zip(group.response_ids, group.sampler_logprobs):
            tokens = torch.tensor([list(group.prompt_ids) + list(response)], device=device)
            logits = policy(input_ids=tokens).logits[:, :-1]
            logp, _ = logprobs_and_entropy(logits, tokens[:, 1:], sampling.temperature)
            mine = logp[0, len(group.prompt_ids) - 1 :].cpu()
            gaps.append((mine - torch.tensor(reported)).abs().max().item())
    return max(gaps)


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, list[bool]]:
    """``(label, is_majority)`` as the rewards vote (``group_answers`` + ``majority_class``): the winning answer as
    first written and, per answer, whether it agrees; ``(None, all False)`` when no answer is present."""
    classes = group_answers(answers)
    winner = majority_class(classes)
    if winner is None:
        return None, [False] * len(answers)
    return answers[classes.index(winner)], [c == winner for c in classes]


class PathInCheckpoint(L.Callback):
    """A user's callback that keeps a ``PurePosixPath`` in every checkpoint: an object outside ``torch.load``'s
    ``weights_only`` allow-list, in a checkpoint that is whole."""

    def on_save_checkpoint(self, trainer, module, checkpoint: dict) -> None:
        checkpoint["data_root"] = PurePosixPath("/scratch/data")
