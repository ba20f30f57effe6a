"""FlexAttention over a packed row (``Batching.flex_attention``): the block mask, the numbers, one trace for any row.

torch has no FlexAttention backward on a CPU, so here the path runs without gradients (uncompiled: the CPU's
compiled flex kernels are not what a GPU runs); ``test_flex_on_a_gpu_trains_as_the_sequencewise_path`` is the real
thing, forward and backward, compiled, and skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from helpers import tied_qwen3
from torch.nn.attention.flex_attention import create_block_mask
from transformers import AutoModelForCausalLM

from evolrl.logprobs.packed_flex import PACKED_FLEX, check_flex, document_block_mask, use_packed_flex
from evolrl.logprobs.packing import check_packing, packed_logprobs
from evolrl.logprobs.sequences import Sequences
from evolrl.logprobs.sequencewise_attention import SEQUENCEWISE_SDPA
from evolrl.settings import SettingError
from evolrl.training import Batching

ROWS = [[300], [100, 60], [130, 70, 20, 200], [1, 128, 127, 129, 5]]
"""Sequence lengths of packed rows: one sequence, boundaries inside and on the 128-token blocks, one-token ones."""


@pytest.mark.parametrize("lengths", ROWS, ids=str)
def test_the_block_mask_is_the_one_the_mask_function_gives(lengths):
    """Which key blocks each query block reads, built from the lengths, equals torch's own evaluation of the mask at
    every position (``create_block_mask``), which a real row's 32k tokens would make gigabytes."""
    document = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def within_sequence(batch, head, q, kv):
        return (document[q] == document[kv]) & (q >= kv)

    size = sum(lengths)
    expected = create_block_mask(within_sequence, None, None, size, size, device="cpu").to_dense()
    built = document_block_mask(lengths, torch.device("cpu"))
    assert built.shape[-2:] == (size, size)
    assert torch.equal(built.to_dense(), expected)


def sequences(vocab: int, lengths: list[int], prompt: int = 4) -> Sequences:
    generator = torch.Generator().manual_seed(0)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=generator)
    attention = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    response = torch.zeros(len(lengths), width - 1, dtype=torch.bool)
    for i, length in enumerate(lengths):
        response[i, min(prompt, length) - 1 : length - 1] = True
    return Sequences(ids * attention, attention, response_mask=response, advantages=torch.zeros(len(lengths)))


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, tiny_model):
    """Two heads sharing one key/value head (grouped queries), as Qwen3 has; attention that picks out positions."""
    return tied_qwen3(tmp_path_factory.mktemp("qwen3"), tokenizer_from=tiny_model, sharp=True)


@pytest.mark.parametrize("lengths", ROWS[1:], ids=str)
def test_a_packed_pass_through_flex_gives_the_sequencewise_numbers(qwen3, lengths):
    model = AutoModelForCausalLM.from_pretrained(qwen3, attn_implementation=SEQUENCEWISE_SDPA).eval()
    seqs = sequences(model.config.vocab_size, lengths)
    with torch.no_grad():
        expected = packed_logprobs(model, seqs, temperature=0.7, chunk_size=64)
        use_packed_flex(model)
        assert model.config._attn_implementation == PACKED_FLEX
        got = packed_logprobs(model, seqs, temperature=0.7, chunk_size=64)
    for value, reference in zip(got, expected):  # float32, another summation order: ~1e-6
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    check_packing(model)  # the start-up probe passes: packed sequences cannot see each other


def test_one_trace_serves_every_row(qwen3):
    """A compiled block traced once with symbolic lengths serves rows of other lengths and other sequence counts
    (each with a new mask function): dynamo does not trace again per row. The graph-capture backend (``aot_eager``)
    guards as inductor's does; inductor's CPU flex kernels are not the GPU's."""
    from torch._dynamo.utils import counters

    model = AutoModelForCausalLM.from_pretrained(qwen3, attn_implementation=PACKED_FLEX).eval()
    torch._dynamo.reset()
    counters.clear()
    for block in model.model.layers:
        block.forward = torch.compile(block.forward, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for lengths in ROWS[1:]:
            seqs = sequences(model.config.vocab_size, lengths)
            packed_logprobs(model, seqs, temperature=0.7, chunk_size=64)
    assert counters["stats"]["unique_graphs"] <= 2  # the first row with fixed lengths, then one symbolic trace


def test_torch_still_has_no_flex_attention_backward_on_a_cpu():
    """Why ``check_flex`` refuses a CPU: the day torch gains the backward this fails, and the refusal can go."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (torch.randn(1, 2, 128, 16, requires_grad=True) for _ in range(3))
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, k, v)


def test_flex_is_refused_where_it_cannot_train():
    with pytest.raises(SettingError, match=r"Batching\.flex_attention=True is not allowed: false on 'cpu'"):
        check_flex(torch.device("cpu"))
    with pytest.raises(SettingError, match=r"Batching\.flex_attention=True is not allowed: false unless packed"):
        Batching(flex_attention=True)
    with pytest.raises(SettingError, match=r"Batching\.flex_attention='yes' is not allowed: true or false"):
        Batching(flex_attention="yes", packed=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compiled_blocks", [False, True])
def test_flex_on_a_gpu_trains_as_the_sequencewise_path(qwen3, compiled_blocks):
    """Forward and backward on CUDA under bf16 autocast, compiled (flex alone, or inside compiled blocks): the
    log-probs and every gradient of the sequence-wise path, up to bf16 rounding (2^-8 relative per operation)."""
    from evolrl.logprobs.compiled import compile_blocks

    results = []
    for attention in (SEQUENCEWISE_SDPA, PACKED_FLEX):
        model = AutoModelForCausalLM.from_pretrained(qwen3, attn_implementation=attention).cuda()
        if compiled_blocks:
            compile_blocks(model)
        for lengths in ROWS[1:]:  # rows of new lengths: no new trace may fail
            seqs = sequences(model.config.vocab_size, lengths).to(torch.device("cuda"))
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logp, entropy = packed_logprobs(model, seqs, temperature=0.7, chunk_size=64)
            (logp.sum() + entropy.sum()).backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (expected, grads), (got, flex_grads) = results
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    for name, grad in grads.items():
        torch.testing.assert_close(flex_grads[name], grad, rtol=5e-2, atol=5e-2 * float(grad.abs().max()), msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["policy-under-autocast", "bf16-reference"])
def test_flex_in_compiled_blocks_without_gradients_gives_the_sequencewise_log_probs(qwen3, dtype):
    """The passes without gradients inside compiled blocks (the old log-probs' under autocast, the reference's in
    bf16), rows of new lengths: flex's no-gradient call, whose compile failed on an H200 at the 1.7B shape before it
    asked for the log-sum-exp (packed_flex's docstring). The log-probs of the sequence-wise path, up to bf16
    rounding (as the training test's tolerance)."""
    from evolrl.logprobs.compiled import compile_blocks

    results = []
    for attention in (SEQUENCEWISE_SDPA, PACKED_FLEX):
        model = AutoModelForCausalLM.from_pretrained(qwen3, attn_implementation=attention, dtype=dtype).cuda()
        compile_blocks(model)
        rows = []
        for lengths in ROWS[1:]:
            seqs = sequences(model.config.vocab_size, lengths).to(torch.device("cuda"))
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                rows.append(packed_logprobs(model, seqs, temperature=0.7, chunk_size=64)[0])
        results.append(rows)
    for expected, got in zip(*results):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
