"""Gradient checkpointing on every n-th decoder layer (``EvolRLModule.gradient_checkpointing``), and a training
pass's own head chunk (``Batching.train_logprob_chunk_size``).

Neither changes the update's math, only what is kept for the backward and how the head is cut, so one training
update's gradients must be those without checkpointing, on a tiny 4-layer Llama, padded and packed. Tolerances:

* checkpointing alone: a checkpointed layer's backward recomputes its forward with the same kernels on the same float32
  inputs; on a CPU the gradients came out bit for bit, but a recomputation is not promised to pick the same kernels
  (nor a GPU's to be deterministic), so they are compared at float32 rounding: ``rtol=1e-5`` and ``atol`` 1e-6 of
  each gradient's largest entry;
* a larger training chunk: the log-prob step's gradients (the LM head's weight gradient above all) are summed over
  fewer, larger chunks, another order of float32 additions: measured up to 1.5e-7 of a gradient's largest entry,
  within the same tolerance.

Which layers checkpoint is read off the recomputation itself: with ``gradient_checkpointing=2`` the MLPs of layers 0
and 2 run twice in a forward/backward (the pass, then the recomputation), those of 1 and 3 once; compiled blocks
(``compiled._checkpointing``) follow the same per-layer flags.
"""

from __future__ import annotations

import pytest
import torch
from helpers import mixed_sequences, scalars, tiny_config
from transformers import LlamaConfig, LlamaForCausalLM

from evolrl.cli import main
from evolrl.logprobs import Passes, Sequences
from evolrl.models import load_policy, load_tokenizer
from evolrl.settings import SettingError
from evolrl.training import Batching, EvolRLModule, GRPOLoss, GRPOUpdate
from evolrl.training.build import Dtypes, build_models

LAYERS = 4


@pytest.fixture(scope="module")
def four_layers(tiny_model, tmp_path_factory) -> str:
    """The tiny model's tokenizer and shape, with 4 decoder layers."""
    directory = tmp_path_factory.mktemp("tiny-llama-4")
    config = LlamaConfig.from_pretrained(tiny_model)
    config.num_hidden_layers = LAYERS
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    load_tokenizer(tiny_model).save_pretrained(directory)
    return str(directory)


class KeepGradients:
    """An optimizer that keeps the gradients of its step and moves nothing (the update's one optimizer step)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.named = list(model.named_parameters())
        self.grads: dict[str, torch.Tensor] = {}

    def step(self) -> None:
        self.grads = {name: p.grad.detach().clone() for name, p in self.named if p.grad is not None}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, parameter in self.named:
            parameter.grad = None


class NoSchedule:
    def step(self) -> None:
        pass


def models(name: str, checkpointing: bool | int, packed: bool, compiled: bool = False):
    return build_models(name, Dtypes.resolve("32-true", "float32"), with_reference=True,
                        gradient_checkpointing=checkpointing, passes=Passes(packed=packed, compiled=compiled))


def update_gradients(name: str, seqs: Sequences, checkpointing: bool | int, packed: bool,
                     train_chunk: int | None = None) -> dict[str, torch.Tensor]:
    """The gradients of one training update on ``seqs``: one mini-batch (one optimizer step) of passes of 2 (padded)
    or at most 48 tokens (packed), KL to the reference and an entropy bonus on, nothing clipped."""
    policy, reference = models(name, checkpointing, packed)
    passes = {"max_tokens_per_micro_batch": 48} if packed else {"micro_batch_size": 2}
    batching = Batching(mini_batch_size=len(seqs), packed=packed, logprob_chunk_size=16,
                        train_logprob_chunk_size=train_chunk, **passes)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.05, entropy_coef=0.01), batching, max_grad_norm=1e9)
    optimizer = KeepGradients(policy)
    update(policy, reference, seqs, temperature=0.7, optimizer=optimizer, scheduler=NoSchedule())
    assert optimizer.grads
    return optimizer.grads


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_update_has_the_same_gradients_whatever_is_checkpointed_and_chunked(four_layers, packed):
    seqs = mixed_sequences(vocab=300)
    plain = update_gradients(four_layers, seqs, checkpointing=False, packed=packed)
    for checkpointing, train_chunk in [(True, None), (1, None), (2, None), (False, 64), (2, 64)]:
        grads = update_gradients(four_layers, seqs, checkpointing, packed, train_chunk)
        assert grads.keys() == plain.keys()
        for name, grad in plain.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()),
                                       msg=f"{name}: checkpointing={checkpointing}, train chunk {train_chunk}")


def test_training_passes_take_their_own_chunk_and_no_grad_passes_the_other(four_layers, monkeypatch):
    import evolrl.training.update as update_module

    chunks = []

    def recording(model, seqs, temperature, passes, **kwargs):
        chunks.append((torch.is_grad_enabled(), passes.chunk_size))
        return token_stats(model, seqs, temperature, passes, **kwargs)

    token_stats = update_module.token_stats
    monkeypatch.setattr(update_module, "token_stats", recording)
    update_gradients(four_layers, mixed_sequences(vocab=300), checkpointing=False, packed=False, train_chunk=64)
    assert {chunk for grad, chunk in chunks if grad} == {64}
    assert {chunk for grad, chunk in chunks if not grad} == {16}  # the reference's passes
    chunks.clear()
    update_gradients(four_layers, mixed_sequences(vocab=300), checkpointing=False, packed=False)
    assert {chunk for _, chunk in chunks} == {16}  # null: logprob_chunk_size everywhere


def mlp_calls(policy: torch.nn.Module, seqs: Sequences, packed: bool) -> list[int]:
    """How many times each layer's MLP is called in one training pass, forward and backward: a pre-hook, since the
    recomputation stops (torch's early stop) once it has what the backward needs, before the MLP returns."""
    calls = [0] * LAYERS
    hooks = [layer.mlp.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, layer in enumerate(policy.model.layers)]
    update = GRPOUpdate(GRPOLoss(kl_coef=0.0), Batching(mini_batch_size=len(seqs), micro_batch_size=len(seqs),
                                                        packed=packed, logprob_chunk_size=16), max_grad_norm=1e9)
    logp, entropy = update.forward(policy, seqs, temperature=0.7)
    ((logp + entropy) * seqs.response_mask).sum().backward()
    for hook in hooks:
        hook.remove()
    return calls


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize(("checkpointing", "flags", "calls"), [
    (False, [False] * 4, [1, 1, 1, 1]),
    (True, [True] * 4, [2, 2, 2, 2]),
    (2, [True, False, True, False], [2, 1, 2, 1]),
    (3, [True, False, False, True], [2, 1, 1, 2]),
    (5, [True, False, False, False], [2, 1, 1, 1]),
])
def test_every_nth_layer_recomputes_and_the_others_keep_their_activations(four_layers, packed, checkpointing,
                                                                          flags, calls):
    policy, _ = models(four_layers, checkpointing, packed)
    assert [layer.gradient_checkpointing for layer in policy.model.layers] == flags
    assert mlp_calls(policy, mixed_sequences(vocab=300), packed) == calls


@pytest.mark.slow  # compiling a block takes ~10-30 s on 2 cores
def test_compiled_blocks_checkpoint_the_same_layers(four_layers):
    """``compile_blocks`` keeps transformers' checkpointing outside each compiled block and reads the block's own flag:
    with ``gradient_checkpointing=2`` only layers 0 and 2 go through the checkpoint function."""
    from evolrl.logprobs.compiled import check_compiler

    check_compiler(torch.device("cpu"))
    torch._dynamo.reset()
    policy, _ = models(four_layers, 2, packed=False, compiled=True)
    checkpoints = [0] * LAYERS
    for i, layer in enumerate(policy.model.layers):
        def counted(function, *args, i=i, checkpoint=layer._gradient_checkpointing_func, **kwargs):
            checkpoints[i] += 1
            return checkpoint(function, *args, **kwargs)

        layer._gradient_checkpointing_func = counted
    seqs = mixed_sequences(vocab=300)
    update = GRPOUpdate(GRPOLoss(kl_coef=0.0), Batching(mini_batch_size=8, micro_batch_size=8, logprob_chunk_size=16,
                                                        compile_blocks=True), max_grad_norm=1e9)
    logp, entropy = update.forward(policy, seqs, temperature=0.7)
    ((logp + entropy) * seqs.response_mask).sum().backward()
    assert checkpoints == [1, 0, 1, 0]
    assert all(p.grad is not None for p in policy.model.layers.parameters())


@pytest.mark.parametrize("value", [-1, "x", 1.5, None])
def test_bad_values_stop_the_module_naming_the_setting(tiny_model, value):
    with pytest.raises(SettingError, match=r"EvolRLModule\.gradient_checkpointing=.* is not allowed"):
        EvolRLModule(tiny_model, gradient_checkpointing=value)


def test_the_setting_is_saved_as_given(tiny_model):
    for value in (False, True, 0, 1, 3):
        saved = EvolRLModule(tiny_model, gradient_checkpointing=value).hparams["gradient_checkpointing"]
        assert saved == value and type(saved) is type(value)


@pytest.mark.parametrize("value", [0, -2, 1.5, "64"])
def test_a_bad_training_chunk_is_refused(value):
    with pytest.raises(SettingError, match=r"Batching\.train_logprob_chunk_size=.* is not allowed: an integer >= 1"):
        Batching(train_logprob_chunk_size=value)


def test_the_cli_trains_checkpointing_every_second_layer(tmp_path, tiny_model, monkeypatch):
    """One step of ``fit`` with ``--model.gradient_checkpointing=2`` (the tiny model's 2 layers: layer 0 checkpointed)
    and a training head chunk: the setting arrives as the integer 2, and the step moves the weights."""
    monkeypatch.setattr("sys.argv", ["evolrl"])
    config = tiny_config(tmp_path, tiny_model, steps=1)
    cli = main(["fit", "--config", str(config), "--model.gradient_checkpointing=2",
                "--model.batching.train_logprob_chunk_size=64"])
    assert cli.model.hparams["gradient_checkpointing"] == 2
    assert [layer.gradient_checkpointing for layer in cli.model.policy.model.layers] == [True, False]
    assert cli.model.update.batching.train_logprob_chunk_size == 64
    assert cli.trainer.global_step == 1 and len(scalars(tmp_path / "tiny")["train/loss"]) == 1
    loaded = load_policy(tiny_model).state_dict()
    trained = cli.model.policy.state_dict()
    assert any(not torch.equal(trained[name], loaded[name]) for name in loaded)
