"""The fused LM head + log-prob/entropy function against the two paths it replaces: full logits, then either
``logprobs_and_entropy`` (the chunked function on logits) or a naive autograd ``log_softmax``."""

import pytest
import torch

from evolrl.logprobs.chunked_head import head_logprobs_and_entropy
from evolrl.logprobs.from_logits import logprobs_and_entropy

N, L, H, V = 3, 5, 6, 11  # 15 rows: chunk 4 straddles sequences and leaves a short last chunk, 5 divides, 64 is one


def make(dtype=torch.float64, seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, L, H, generator=g, dtype=dtype)
    weight = torch.randn(V, H, generator=g, dtype=dtype)
    b = torch.randn(V, generator=g, dtype=dtype) if bias else None
    tokens = torch.randint(0, V, (N, L), generator=g)
    upstream = torch.randn(2, N, L, generator=g, dtype=dtype)
    return hidden, weight, b, tokens, upstream


def naive(hidden, weight, bias, tokens, temperature):
    """Plain autograd: full logits, full log-softmax."""
    logits = hidden @ weight.T + (0 if bias is None else bias)
    logq = torch.log_softmax(logits / temperature, dim=-1)
    return logq.gather(-1, tokens[..., None]).squeeze(-1), -(logq.exp() * logq).sum(-1)


def reference(hidden, weight, bias, tokens, temperature):
    """Today's path: the model's full logits, then the chunked function on them."""
    logits = hidden @ weight.T + (0 if bias is None else bias)
    return logprobs_and_entropy(logits, tokens, temperature, chunk_size=4)


def values_and_grads(fn, hidden, weight, bias, tokens, temperature, upstream, use=(0, 1)):
    leaves = [t.detach().clone().requires_grad_(True) for t in (hidden, weight) + ((bias,) if bias is not None else ())]
    outputs = fn(leaves[0], leaves[1], leaves[2] if bias is not None else None, tokens, temperature)
    sum(((outputs[i] * upstream[i]).sum() for i in use), torch.zeros(())).backward()
    return [o.detach() for o in outputs], [t.grad for t in leaves]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [4, 5, 64])
@pytest.mark.parametrize("use", [(0, 1), (0,), (1,)])  # both outputs, log-probs alone, entropy alone
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_full_logit_paths(temperature, chunk_size, use, dtype):
    hidden, weight, bias, tokens, upstream = make(dtype, bias=chunk_size == 5)

    def fused(h, w, b, t, temp):
        return head_logprobs_and_entropy(h, w, tokens=t, temperature=temp, chunk_size=chunk_size, bias=b)

    out, grads = values_and_grads(fused, hidden, weight=weight, bias=bias, tokens=tokens, temperature=temperature,
                                  upstream=upstream, use=use)
    assert all(o.dtype == (torch.float64 if dtype == torch.float64 else torch.float32) for o in out)
    assert all(g.dtype == dtype for g in grads)
    tight = {"atol": 1e-12, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 2e-5, "rtol": 1e-5}
    naive_out, naive_grads = values_and_grads(naive, hidden, weight=weight, bias=bias, tokens=tokens,
                                              temperature=temperature, upstream=upstream, use=use)
    for a, b in zip(out + grads, naive_out + naive_grads):
        torch.testing.assert_close(a, b.to(a.dtype), **tight)
    # logprobs.py computes in float32 whatever the input: float32-level agreement
    ref_out, ref_grads = values_and_grads(reference, hidden, weight=weight, bias=bias, tokens=tokens,
                                          temperature=temperature, upstream=upstream, use=use)
    for a, b in zip(out + grads, ref_out + ref_grads):
        torch.testing.assert_close(a.to(b.dtype), b, atol=2e-5, rtol=1e-5)


def test_gradcheck_float64():
    hidden, weight, bias, tokens, _ = make(bias=True)
    hidden, weight, bias = (t[:2, :3].clone() if t.dim() == 3 else t.clone() for t in (hidden, weight, bias))
    tokens = tokens[:2, :3]

    def fn(h, w, b):
        return head_logprobs_and_entropy(h, w, tokens=tokens, temperature=0.7, chunk_size=4, bias=b)

    assert torch.autograd.gradcheck(fn, (hidden.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()))


def test_tied_weight_gradients_accumulate():
    """The head's weight is also the input embedding: both uses' gradients must land on the one Parameter."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V, (N, L + 1), generator=g)
    mix = torch.randn(H, H, generator=g, dtype=torch.float64)
    upstream = torch.randn(2, N, L, generator=g, dtype=torch.float64)
    grads = []
    for path in ("fused", "naive"):
        embed = torch.nn.Embedding(V, H, dtype=torch.float64)
        with torch.no_grad():
            embed.weight.copy_(torch.randn(V, H, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
        hidden = torch.tanh(embed(ids[:, :-1]) @ mix)  # a stand-in for the decoder
        if path == "fused":
            logp, ent = head_logprobs_and_entropy(hidden, embed.weight, tokens=ids[:, 1:], temperature=0.7,
                                                  chunk_size=4)
        else:
            logp, ent = naive(hidden, embed.weight, bias=None, tokens=ids[:, 1:], temperature=0.7)
        (logp * upstream[0] + ent * upstream[1]).sum().backward()
        grads.append(embed.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=1e-10)


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("autocast", [False, True])
def test_bf16(autocast):
    """bf16 weights, or float32 ones under bf16 autocast: matmuls in bf16, softmax in float32.

    Against float64 on the same bf16-rounded inputs, the only error that is not float32 round-off is the rounding
    of each logit to bf16: at most ``d = 2**-8 * max|logit|`` (half an ulp is 2**-9 relative; twice that for margin).
    A shift of every ``x = logit / T`` by at most ``d / T`` moves ``log p(t) = x_t - lse`` by at most ``2 d / T`` and
    the entropy by at most ``E_p|log p + H| d / T <= 2 H d / T``. Gradients go through bf16 once more (the
    ``[C, V]`` gradient of the logits is rounded before its matmuls), so they are compared by norm at 2**-5, a few
    bf16 roundings, and against today's bf16 path (full bf16 logits) at 2**-6.
    """
    hidden, weight, _, tokens, upstream = make(torch.float32, seed=5)
    hidden, weight = hidden.bfloat16().float() * 2, weight.bfloat16().float()  # exactly representable in bf16
    upstream = upstream.float()
    temperature = 0.7
    inputs = (hidden, weight) if autocast else (hidden.bfloat16(), weight.bfloat16())

    def fused(h, w, b, t, temp):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return head_logprobs_and_entropy(h, w, tokens=t, temperature=temp, chunk_size=4)

    def today(h, w, b, t, temp):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = torch.nn.functional.linear(h, w)  # what lm_head returns: bf16 logits
        return logprobs_and_entropy(logits, t, temp, chunk_size=4)

    out, grads = values_and_grads(fused, *inputs[:2], bias=None, tokens=tokens, temperature=temperature,
                                  upstream=upstream)
    assert all(o.dtype == torch.float32 for o in out)
    assert all(g.dtype == (torch.float32 if autocast else torch.bfloat16) for g in grads)
    exact_out, exact_grads = values_and_grads(naive, hidden.double(), weight=weight.double(), bias=None, tokens=tokens,
                                              temperature=temperature, upstream=upstream.double())
    d = 2**-8 * float((hidden.double() @ weight.double().T).abs().max())
    assert (out[0].double() - exact_out[0]).abs().max() <= 2 * d / temperature
    assert ((out[1].double() - exact_out[1]).abs() <= 2 * exact_out[1] * d / temperature + 1e-6).all()
    for a, b in zip(grads, exact_grads):
        assert _relative_error(a, b) < 2**-5
    today_out, today_grads = values_and_grads(today, *inputs[:2], bias=None, tokens=tokens, temperature=temperature,
                                              upstream=upstream)
    # The same bf16 logits and float32 softmax, up to one rounding: the fused path's matmuls run on chunks of 4 rows,
    # today's on all rows at once, and a CPU's kernel (picked by row count) may sum in another order, so a logit can
    # land on the neighbouring bf16 value (equal on the CPUs measured; the bounds above are one such rounding).
    bounds = (2 * d / temperature, 2 * exact_out[1] * d / temperature + 1e-6)
    for a, b, bound in zip(out, today_out, bounds, strict=True):
        assert ((a.double() - b.double()).abs() <= bound).all()
    for a, b in zip(grads, today_grads):
        assert _relative_error(a, b) < 2**-6


def test_no_grad_and_bad_chunk():
    hidden, weight, _, tokens, _ = make(torch.float32)
    with torch.no_grad():
        logp, ent = head_logprobs_and_entropy(hidden, weight, tokens, chunk_size=4)
    torch.testing.assert_close(logp, torch.log_softmax(hidden @ weight.T, -1).gather(-1, tokens[..., None])[..., 0])
    assert not logp.requires_grad and (ent <= torch.log(torch.tensor(float(V))) + 1e-5).all()
    with pytest.raises(ValueError, match="chunk_size"):
        head_logprobs_and_entropy(hidden, weight, tokens, chunk_size=0)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_token_stats_are_the_log_probs_the_entropy_and_the_vocabulary_mean(chunk_size):
    """What a reward that reads the policy gets (no gradients), from the fused head and from the logits alike."""
    from evolrl.logprobs.chunked_head import head_token_stats
    from evolrl.logprobs.from_logits import token_stats

    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 7, 16, generator=g), torch.randn(50, 16, generator=g)
    bias = torch.randn(50, generator=g)
    tokens = torch.randint(0, 50, (2, 7), generator=g)
    logq = torch.log_softmax((hidden @ weight.T + bias) / 0.7, dim=-1)
    expected = (logq.gather(-1, tokens[..., None]).squeeze(-1), -(logq.exp() * logq).sum(-1), logq.mean(-1))
    fused = head_token_stats(hidden.requires_grad_(), weight, tokens=tokens, temperature=0.7, chunk_size=chunk_size,
                             bias=bias)
    from_logits = token_stats(hidden.detach() @ weight.T + bias, tokens, temperature=0.7, chunk_size=chunk_size)
    for got in (fused, from_logits):
        assert all(not t.requires_grad for t in got)
        for g_, e in zip(got, expected):
            torch.testing.assert_close(g_, e, rtol=1e-5, atol=1e-5)
    # The log-probs and entropy are the training path's own numbers.
    logp, entropy = head_logprobs_and_entropy(hidden, weight, tokens=tokens, temperature=0.7, chunk_size=chunk_size,
                                              bias=bias)
    torch.testing.assert_close(fused[0], logp.detach(), rtol=0, atol=0)
    torch.testing.assert_close(fused[1], entropy.detach(), rtol=0, atol=0)


@pytest.mark.slow  # compiling the chunk functions: ~10-20 s each variant on 2 cores
@pytest.mark.parametrize("autocast", [False, True])
def test_compiled_chunks_give_the_eager_numbers(autocast):
    """``compiled=True`` (``Batching.compile_blocks``): each chunk's softmax statistics and gradient through
    torch.compile. The matmuls stay outside it, so both paths see the same logits; inductor's fused reductions sum in
    another order, so the float32 values agree to float32 round-off (1e-5 of their scale), not bit for bit. Under
    bf16 autocast the gradient of the logits is rounded to bf16 before its matmuls in both paths, and a float32
    difference at round-off can move a value to the neighbouring bf16 one: gradients are compared by norm at 2**-7,
    one bf16 rounding (2**-8 relative) with a factor two of margin."""
    from torch._dynamo.utils import counters

    from evolrl.logprobs.chunked_head import head_token_stats

    torch._dynamo.reset()
    counters.clear()
    hidden, weight, bias, tokens, upstream = make(torch.float32, seed=3, bias=True)
    upstream = upstream.float()

    def run(compiled, use):
        def fused(h, w, b, t, temp):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return head_logprobs_and_entropy(h, w, tokens=t, temperature=temp, chunk_size=4, bias=b,
                                                 compiled=compiled)

        return values_and_grads(fused, hidden, weight=weight, bias=bias, tokens=tokens, temperature=0.7,
                                upstream=upstream, use=use)

    for use in ((0, 1), (0,)):  # both outputs' gradients, then the entropy's None: another variant of the backward
        (out, grads), (eager_out, eager_grads) = run(True, use), run(False, use)
        for a, b in zip(out, eager_out, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
        for a, b in zip(grads, eager_grads, strict=True):
            assert a.dtype == b.dtype
            if autocast:
                assert _relative_error(a, b) < 2**-7
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        stats = [head_token_stats(hidden, weight, tokens=tokens, temperature=0.7, chunk_size=4, bias=bias,
                                  compiled=compiled) for compiled in (True, False)]
    for a, b in zip(*stats, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    # compiled, whole: graphs for the forward's statistics (with and without the vocabulary mean) and the backward's
    # two variants, none of them broken
    assert counters["stats"]["unique_graphs"] >= 4 and not counters["graph_break"], dict(counters)


def test_a_zero_entropy_gradient_and_none_give_the_same_gradients():
    """An entropy coefficient of 0 leaves the entropy out of the loss's graph (``update.pass_loss``), so the head's
    backward gets ``None`` for it instead of zeros. Exactly the same gradients: the entropy's term, scaled by -0, adds
    signed zeros, and ``±0 - y`` is ``-y`` bit for bit (IEEE arithmetic, one machine, the same kernels both ways)."""
    hidden, weight, bias, tokens, upstream = make(torch.float32, seed=4, bias=True)
    grads = []
    for with_zero_entropy in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
        logp, entropy = head_logprobs_and_entropy(*leaves[:2], tokens=tokens, temperature=0.7, chunk_size=4,
                                                  bias=leaves[2])
        loss = (logp * upstream[0].float()).sum()
        (loss - 0.0 * entropy.sum() if with_zero_entropy else loss).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
