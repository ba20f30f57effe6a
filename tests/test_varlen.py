"""Torch's varlen attention op on a packed row (``evolrl/logprobs/varlen.py``): the project's CPU kernels against the
per-sequence sdpa path, and a compiled block traced once for every row it meets.

Tolerances: without GQA the CPU kernels run, sequence by sequence, the very flash kernels sdpa runs on a CPU, so
outputs and gradients are equal bit for bit; with GQA sdpa takes its math path while the kernels hand the grouped
heads to the flash kernel (which sums a group's key/value gradients itself), so the two differ by float32 rounding
(1e-6). The GPU test compares torch's own CUDA kernels with the per-sequence path at bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import mixed_sequences

from evolrl.logprobs import Passes, varlen

pytestmark = pytest.mark.skipif(not varlen.available(), reason="this torch has no varlen attention op")

LENGTHS = [3, 5, 2]
CU = torch.tensor([0, 3, 8, 10], dtype=torch.int32)


def per_sequence(q, k, v, scale):
    """The per-sequence path: one sdpa call per sequence, ``[1, H, s, D]`` as transformers hands them over."""
    bounds = list(zip(CU.tolist(), CU.tolist()[1:]))
    return torch.cat([F.scaled_dot_product_attention(*(x[s:e].transpose(0, 1)[None] for x in (q, k, v)),
                                                     is_causal=True, scale=scale,
                                                     enable_gqa=q.shape[1] != k.shape[1])[0].transpose(0, 1)
                      for s, e in bounds])


def row(heads: int, kv_heads: int, dtype=torch.float32, device="cpu"):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(sum(LENGTHS), h, 8, generator=generator, dtype=dtype).to(device).requires_grad_()
            for h in (heads, kv_heads, kv_heads)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_kernels_are_the_per_sequence_path_bit_for_bit(dtype):
    q, k, v = row(4, 4, dtype)
    out, expected = varlen.attend(q, k, v, CU, 5, scale=0.3), per_sequence(q, k, v, 0.3)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        assert torch.equal(a, b)


def test_grouped_query_heads_and_the_gradient_check():
    q, k, v = row(4, 2)
    out, expected = varlen.attend(q, k, v, CU, 5, scale=0.3), per_sequence(q, k, v, 0.3)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(expected, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    q, k, v = (x.detach().double().requires_grad_() for x in row(4, 2))
    assert torch.autograd.gradcheck(lambda q, k, v: varlen.attend(q, k, v, CU, 5, scale=0.3), (q, k, v))


def test_the_log_sum_exp_is_each_querys_over_its_own_causal_keys():
    q, k, v = (x.detach() for x in row(2, 2))
    _, lse = varlen.varlen_attn(q, k, v, CU, CU, 5, 5, scale=0.3, window_size=varlen.CAUSAL,
                                return_aux=torch.nn.attention.varlen.AuxRequest(lse=True))
    start, end = 3, 8  # the second sequence
    scores = 0.3 * q[start:end].transpose(0, 1) @ k[start:end].transpose(0, 1).transpose(1, 2)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.reshape(2, -1)[:, start:end] if lse.shape[0] == 2 else lse.T[:, start:end],
                               scores.logsumexp(-1), rtol=1e-5, atol=1e-5)


def test_a_compiled_block_is_traced_once_for_rows_of_any_lengths(tiny_model, monkeypatch):
    """After the first passes (warm-up: a first trace, then the one dynamic in the row's length and sequence count),
    packed passes of other lengths and sequence counts trace no graph, forward or backward, and nothing breaks one."""
    from test_compiled import recorded_graphs

    from evolrl.logprobs.packing import packed_logprobs
    from evolrl.training.build import Dtypes, build_models

    graphs = recorded_graphs(monkeypatch)
    policy, _ = build_models(tiny_model, Dtypes.resolve("32-true", "float32"), with_reference=False, 
                             passes=Passes(packed=True, compiled=True))

    def passes(seeds):
        for seed in seeds:
            seqs = mixed_sequences(policy.config.vocab_size, seed=seed)
            logp, _ = packed_logprobs(policy, seqs.select(list(range(seed % 3 + 2))), temperature=1.0, chunk_size=16)
            logp.sum().backward()

    passes(range(2))
    warm = len(graphs)
    passes(range(2, 6))
    assert len(graphs) == warm > 0
    assert not torch._dynamo.utils.counters["graph_break"]


def test_the_op_takes_half_precision_rows_on_cuda_and_any_row_on_a_cpu():
    # Torch's CUDA varlen kernels are flash's, float16 and bfloat16 only: a float32 row on a GPU (a `32-true` run)
    # raised inside the op before this check. Fake tensors carry a CUDA device and a dtype without a GPU.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        on_cuda = {dtype: varlen.runs(torch.empty(4, 2, 8, device="cuda", dtype=dtype))
                   for dtype in (torch.float32, torch.float16, torch.bfloat16)}
    assert on_cuda == {torch.float32: False, torch.float16: True, torch.bfloat16: True}
    assert all(varlen.runs(torch.empty(4, 2, 8, dtype=dtype)) for dtype in (torch.float32, torch.float64))
    assert not varlen.runs(torch.empty(4, 2, 8, device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_torchs_cuda_kernels_match_the_per_sequence_path_with_grouped_heads():
    """bf16 flash kernels against per-sequence sdpa: bf16 rounding (8 significant bits) of the outputs and grads."""
    q, k, v = row(4, 2, torch.bfloat16, "cuda")
    cu = CU.cuda()
    out = varlen.attend(q, k, v, cu, 5, scale=0.3)
    torch.testing.assert_close(out, per_sequence(q, k, v, 0.3), rtol=2e-2, atol=2e-2)


def test_an_op_without_the_gqa_keyword_gets_the_grouped_heads_as_they_are(monkeypatch):
    # torch 2.11's varlen_attn (the GPU image's) has no enable_gqa; its CUDA kernels take fewer key/value heads as they
    # are. Only the call's keywords are under test here: a stand-in with 2.11's signature records them and runs the
    # CPU kernels, whose numbers the tests above check.
    seen = {}

    def varlen_attn_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                         window_size=(-1, -1)):
        seen.update(window_size=window_size, heads=(query.shape[1], key.shape[1]))
        return torch.ops.torch_attn._varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                                                 scale=scale, window_size=list(window_size))[0]

    monkeypatch.setattr(varlen, "varlen_attn", varlen_attn_2_11)
    varlen._takes_gqa_keyword.cache_clear()
    try:
        q, k, v = row(4, 2)
        out = varlen.attend(q, k, v, CU, max(LENGTHS), scale=0.3)
    finally:
        varlen._takes_gqa_keyword.cache_clear()
    assert seen == {"window_size": varlen.CAUSAL, "heads": (4, 2)}
    torch.testing.assert_close(out, per_sequence(q, k, v, 0.3), rtol=1e-6, atol=1e-6)  # float32 rounding (above)
