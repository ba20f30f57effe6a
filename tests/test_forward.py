"""The forward pass with the LM head fused into the log-prob step: the logits path's numbers, never its logits."""

from __future__ import annotations

import pytest
import torch
from helpers import mixed_sequences
from torch import nn

from evolrl.logprobs.forward import check_fused_head, sequence_logprobs
from evolrl.logprobs.packing import packed_logprobs
from evolrl.models import load_policy
from evolrl.settings import SettingError


def tiny_llama(tied: bool, vocab: int = 300):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def run(model, logprobs, seqs, fused: bool, weights):
    """Log-probs, entropy and parameter gradients of a loss that uses both outputs."""
    model.zero_grad()
    logp, entropy = logprobs(model, seqs, temperature=0.7, chunk_size=16, fused_head=fused)
    ((logp * weights + 0.3 * entropy) * seqs.response_mask).sum().backward()
    return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("logprobs", [sequence_logprobs, packed_logprobs])
def test_the_fused_head_gives_the_logits_paths_values_and_gradients(tied, logprobs):
    model = tiny_llama(tied)
    seqs = mixed_sequences(model.config.vocab_size)
    weights = torch.randn(seqs.response_mask.shape, generator=torch.Generator().manual_seed(1))
    (logp, entropy, grads), (f_logp, f_entropy, f_grads) = (run(model, logprobs, seqs=seqs, fused=f, weights=weights)
                                                            for f in (False, True))
    torch.testing.assert_close(f_logp, logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(f_entropy, entropy, rtol=1e-5, atol=1e-6)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert grads[head].abs().sum() > 0
    for name, grad in grads.items():
        torch.testing.assert_close(f_grads[name], grad, rtol=1e-4, atol=1e-6 * float(grad.abs().max()), msg=name)


def test_the_fused_head_under_bf16_autocast_stays_close_to_the_logits_path():
    model = tiny_llama(tied=False)
    seqs = mixed_sequences(model.config.vocab_size)
    weights = torch.randn(seqs.response_mask.shape, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (logp, _, grads), (f_logp, _, f_grads) = (run(model, sequence_logprobs, seqs=seqs, fused=f, weights=weights)
                                                  for f in (False, True))
    mask = seqs.response_mask
    assert f_logp.dtype == torch.float32
    torch.testing.assert_close(f_logp[mask], logp[mask], rtol=0, atol=2e-2)  # both from the same bf16 logits
    rel = (f_grads["lm_head.weight"] - grads["lm_head.weight"]).norm() / grads["lm_head.weight"].norm()
    assert rel < 2e-2  # the fused path sums the chunks' weight gradients in float32, the logits path in bf16


def saved_sizes(model, logprobs, seqs, fused: bool) -> list[int]:
    """Elements of the storage behind every tensor autograd saves for the backward of one forward pass (a saved
    chunk of the logits is a view: its storage is the whole logits tensor); parameters left out."""
    sizes, weights = [], {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor):
        if tensor.untyped_storage().data_ptr() not in weights:
            sizes.append(tensor.untyped_storage().nbytes() // tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logprobs(model, seqs, temperature=1.0, chunk_size=4, fused_head=fused)
    return sizes


@pytest.mark.parametrize("logprobs", [sequence_logprobs, packed_logprobs])
def test_the_fused_head_never_holds_the_passes_logits(logprobs):
    """Nothing of the size of the pass's logits is kept for the backward (the logits path keeps exactly that); a
    vocabulary large against the width, as in real models, so that the logits are the largest activation."""
    model = tiny_llama(tied=False, vocab=5000)
    seqs = mixed_sequences(model.config.vocab_size)
    scored = int(seqs.response_mask.sum())  # the fewest positions any pass computes logits for
    logits_size = scored * model.config.vocab_size
    assert max(saved_sizes(model, logprobs, seqs, fused=False)) >= logits_size
    assert max(saved_sizes(model, logprobs, seqs, fused=True)) < logits_size / 4


def test_a_tiny_pretrained_layout_passes_the_check(tiny_model):
    check_fused_head(load_policy(tiny_model))


def test_a_soft_capped_model_is_refused_with_the_setting_name():
    """Gemma 2 soft-caps its logits after the output layer: the fused head would give other numbers."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Gemma2ForCausalLM(config)
    with pytest.raises(SettingError, match=r"Batching.fused_head=True is not allowed: .*unchanged.*set it to false"):
        check_fused_head(model)


def test_an_output_layer_that_is_not_a_plain_linear_is_refused():
    model = tiny_llama(tied=False)
    model.set_output_embeddings(nn.Sequential(nn.Linear(32, 300, bias=False)))
    with pytest.raises(SettingError, match=r"Batching.fused_head=True .*plain torch.nn.Linear .*Sequential"):
        check_fused_head(model)
