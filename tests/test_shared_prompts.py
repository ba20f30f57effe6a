"""Shared-prompt passes (``Batching.shared_prompts``): each distinct prompt computed once, the same numbers as a
right-padded pass. Tolerances: float32 with a different summation order (the prompt's keys and values summed into
one gradient, attention over a cache), as ``test_packing.py``'s."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same, logprobs_and_grads, run_update

from evolrl.logprobs import Passes, token_stats
from evolrl.logprobs.forward import sequence_logprobs
from evolrl.logprobs.sequences import Sequences
from evolrl.logprobs.shared_prompts import check_shared_prompts, shared_prompt_gap, shared_prompt_logprobs
from evolrl.models import load_policy
from evolrl.settings import SettingError
from evolrl.training import Batching

PROMPTS = [7, 4, 9]
"""Three prompts of different lengths, so the shorter ones are left-padded in the prompts' pass."""
RESPONSES = [[5, 1, 3], [2, 6], [4, 4, 1]]
"""Each prompt's responses' lengths: one of a single token, whose only value comes from the prompts' pass."""


def grouped_sequences(vocab: int, seed: int = 0) -> Sequences:
    """Right-padded, group-major sequences: each prompt's responses one after another, as ``trained_sequences``."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for prompt_len, lengths in zip(PROMPTS, RESPONSES):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=generator)
        rows += [(prompt, torch.randint(3, vocab, (n,), generator=generator)) for n in lengths]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    response = torch.zeros(len(rows), width - 1, dtype=torch.bool)
    for i, (prompt, answer) in enumerate(rows):
        ids[i, : len(prompt) + len(answer)] = torch.cat([prompt, answer])
        attention[i, : len(prompt) + len(answer)] = 1
        response[i, len(prompt) - 1 : len(prompt) + len(answer) - 1] = True
    return Sequences(ids, attention, response_mask=response, advantages=torch.randn(len(rows), generator=generator))


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(tiny_model)


def test_rows_with_one_prompt_share_its_entry_and_keep_it_when_selected(policy):
    seqs = grouped_sequences(policy.config.vocab_size)
    assert seqs.host_layout().prompts.tolist() == [0, 0, 0, 3, 3, 5, 5, 5]
    assert seqs.select([6, 3, 7, 0]).host_layout().prompts.tolist() == [5, 3, 5, 0]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("fused_head", [True, False])
def test_shared_prompt_values_and_gradients_equal_the_padded_pass(tiny_model, attention, fused_head):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attention)
    seqs = grouped_sequences(model.config.vocab_size)
    padded, shared = (logprobs_and_grads(model, f, seqs, fused_head=fused_head)
                      for f in (sequence_logprobs, shared_prompt_logprobs))
    assert_same(shared, padded, seqs.response_mask, zero_outside=True)


def test_the_vocabulary_mean_and_a_narrowed_mask_come_back_as_padded(policy):
    seqs = grouped_sequences(policy.config.vocab_size)
    narrowed = seqs.response_mask.clone()
    narrowed[0, 7:] = False  # overlong masking after the batch was built: the layout keeps the wider positions
    seqs = Sequences(seqs.input_ids, seqs.attention_mask, narrowed, seqs.advantages, layout=seqs.layout)
    with torch.no_grad():
        padded = token_stats(policy, seqs, 0.7, Passes(chunk_size=16), vocab_mean=True)
        shared = token_stats(policy, seqs, 0.7, Passes(chunk_size=16, shared_prompts=True), vocab_mean=True)
    assert len(shared) == 3
    for ours, theirs in zip(shared, padded):
        torch.testing.assert_close(ours[narrowed], theirs[narrowed], rtol=1e-5, atol=1e-5)
        assert (ours[~narrowed] == 0).all()


def test_a_filler_pass_is_a_padded_one(policy):
    filler = Sequences.filler(torch.device("cpu"))
    with torch.no_grad():
        shared = shared_prompt_logprobs(policy, filler, temperature=0.7, chunk_size=16)
        padded = sequence_logprobs(policy, filler, temperature=0.7, chunk_size=16)
    for ours, theirs in zip(shared, padded):
        assert torch.equal(ours, theirs)


def test_a_step_with_shared_prompts_gives_the_padded_update(tiny_model, policy):
    """The whole update (2 mini-batches, reference and old log-probs passes, SGD): parameters as the padded run's."""
    seqs = grouped_sequences(policy.config.vocab_size)
    _, stats, params = run_update(tiny_model, seqs, micro_batch_size=2)
    _, shared_stats, shared_params = run_update(tiny_model, seqs, micro_batch_size=2, shared_prompts=True)
    for key, value in stats.items():
        assert shared_stats[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for name, value in params.items():  # steps of 1e-6 to 1e-3; float32 rounding leaves ~4e-9
        torch.testing.assert_close(shared_params[name], value, rtol=1e-6, atol=1e-8, msg=name)


def test_the_start_check_passes_a_transformers_model_and_refuses_checkpointed_activations(tiny_model):
    model = load_policy(tiny_model)
    values, gradient = shared_prompt_gap(model)
    assert values < 1e-5 and gradient < 1e-5  # float32 rounding
    assert model.get_input_embeddings().weight.grad is None  # the probe leaves no gradients behind
    check_shared_prompts(model)
    model.gradient_checkpointing_enable()
    with pytest.raises(SettingError, match="Batching.shared_prompts.*checkpoints its activations"):
        check_shared_prompts(model)


def test_the_start_check_refuses_a_pass_that_differs_and_allows_bf16_rounding(tiny_model, monkeypatch):
    from evolrl.logprobs import shared_prompts

    model = load_policy(tiny_model)
    assert shared_prompts.tolerance(model) == 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert shared_prompts.tolerance(model) == 0.1
        check_shared_prompts(model)  # bf16 kernels on both passes: within rounding
    real = shared_prompts.shared_prompt_logprobs

    def off_by_one_token(model, seqs, *args, **kwargs):  # as if each response were scored a position late
        return tuple(torch.roll(values, 1, dims=1) for values in real(model, seqs, *args, **kwargs))

    monkeypatch.setattr(shared_prompts, "shared_prompt_logprobs", off_by_one_token)
    with pytest.raises(SettingError, match=r"Batching.shared_prompts.*log-probs moved by [\d.]+ and a gradient by"):
        check_shared_prompts(model)


def test_shared_prompts_with_compiled_blocks_is_refused_with_its_name():
    with pytest.raises(SettingError, match="Batching.shared_prompts.*compile_blocks"):
        Batching(shared_prompts=True, compile_blocks=True)


def test_shared_prompts_with_packing_is_refused_with_its_name():
    with pytest.raises(SettingError, match="Batching.shared_prompts.*packed"):
        Batching(shared_prompts=True, packed=True)


def test_lora_adapters_and_their_reference_share_prompts_as_the_padded_pass(tiny_model):
    """The adapted policy (gradients into the adapters) and ``AdaptersOff`` (the reference): peft's wrappers pass
    the KV cache and positions through."""
    from evolrl.lora import AdaptersOff, LoRA, add_adapters

    policy = add_adapters(load_policy(tiny_model), LoRA(rank=4, alpha=8.0))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:  # B starts at 0: give the adapters an effect
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    seqs = grouped_sequences(policy.config.vocab_size)
    mask = seqs.response_mask
    results = []
    for logprobs in (sequence_logprobs, shared_prompt_logprobs):
        policy.zero_grad()
        logp, entropy = logprobs(policy, seqs, temperature=0.7, chunk_size=16)
        (logp * mask).sum().backward()
        with torch.no_grad():
            reference = logprobs(AdaptersOff(policy), seqs, temperature=0.7, chunk_size=16)[0]
        results.append((logp.detach(), reference, {n: p.grad.clone() for n, p in policy.named_parameters()
                                                   if p.grad is not None}))
    (logp, reference, grads), (shared_logp, shared_reference, shared_grads) = results
    torch.testing.assert_close(shared_logp[mask], logp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared_reference[mask], reference[mask], rtol=1e-5, atol=1e-5)
    assert grads.keys() == shared_grads.keys() and all(".lora_" in n for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()), msg=name)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_fit_with_shared_prompts_gives_the_padded_gradient(tiny_model, precision):
    """Through Lightning, one step each way on the same sampled groups (the same seed, this process): the start probe
    passes in the run's precision, and the accumulated gradients agree (float32: rounding, as the padded test above;
    bf16 autocast: its rounding of the two passes' different matmul shapes, a few percent of the gradient's norm)."""
    import lightning as L
    from helpers import fit

    from evolrl.rollout import Sampling

    class Capture(L.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.grads = {n: p.grad.clone() for n, p in module.policy.named_parameters()}

    runs = []
    for shared in (False, True):
        L.seed_everything(0)
        capture = Capture()
        fit(tiny_model, module_kwargs={"shared_prompts": shared}, callbacks=[capture],
            sampling=Sampling(temperature=1.5, max_new_tokens=12), trainer_kwargs={"precision": precision})
        runs.append(capture.grads)
    grads, shared_grads = runs
    assert max(float(g.abs().max()) for g in grads.values()) > 0  # the sampled groups' rewards differ
    for name, grad in grads.items():
        if precision == "32-true":
            torch.testing.assert_close(shared_grads[name], grad, rtol=1e-5, atol=1e-6 * float(grad.abs().max()),
                                       msg=name)
        else:
            assert float((shared_grads[name] - grad).norm()) <= 0.05 * float(grad.norm()) + 1e-12, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_gpu_left_padded_prompts_give_finite_gradients_equal_to_the_padded_pass(tiny_model, dtype):
    """CUDA's attention kernels on a left-padded prompt's rows that attend to nothing: finite, and the padded pass's
    numbers (float32: a different summation order; bf16 autocast: a few percent of the norm)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").cuda()
    seqs = grouped_sequences(model.config.vocab_size).to("cuda")
    mask = seqs.response_mask
    results = []
    for logprobs in (sequence_logprobs, shared_prompt_logprobs):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logp, _ = logprobs(model, seqs, temperature=0.7, chunk_size=16)
        (logp * mask).sum().backward()
        results.append((logp.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}))
    (logp, grads), (shared_logp, shared_grads) = results
    assert torch.isfinite(shared_logp).all() and all(torch.isfinite(g).all() for g in shared_grads.values())
    most = 1e-4 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(shared_logp[mask], logp[mask], rtol=0, atol=most)
    for name, grad in grads.items():
        assert float((shared_grads[name] - grad).norm()) <= (1e-4 if dtype == torch.float32 else 0.05) * float(
            grad.norm()) + 1e-12, name
