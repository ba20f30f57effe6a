"""Token log-probs and entropy straight from the final hidden states: the LM head fused in, never all the logits.

``logprobs_and_entropy`` (``logprobs.py``) needs the ``[N, L, V]`` logits the model's head produced, and autograd
keeps them for the backward: with Qwen3's 151,936-token vocabulary, 8 x 4k tokens of bf16 logits are ~10 GB before
any float32 copy. Here one autograd function takes ``hidden [N, L, H]`` and the head's ``weight [V, H]`` and, one
chunk of rows at a time, computes the chunk's logits, its float32 log-softmax, the token's log-prob and the entropy,
then drops the chunk. It saves only its inputs and two numbers per row (``lse``, ``H``); the backward recomputes each
chunk's logits (one extra ``C x H x V`` matmul per chunk, the usual activation-checkpointing trade) and applies the
same formulas as ``logprobs.py``, with ``x = logits / T``:

    d log p(t) / dx = onehot(t) - p        d H / dx = -p * (log p + H)

so the step's peak is one chunk's logits (a few ``[C, V]`` float32 buffers) plus the float32 ``[V, H]`` weight
gradient, whatever the length.

Dtypes, decided here rather than left to autocast (which is on during a custom function's forward but not its
backward, so leaving it implicit would recompute different logits in the backward than the forward saw ``lse`` of):

* compute dtype ``D``: autocast's dtype for the device when autocast is on (what ``lm_head`` under autocast would
  use), else the promoted dtype of ``hidden`` and ``weight`` (FSDP2's mixed precision hands over bf16 copies). The
  matmuls run in ``D``, inside and outside autocast, forward and backward alike;
* the log-softmax, ``lse``, entropy and the gradient of the logits are float32 (float64 when ``D`` is float64, so the
  function can be gradchecked and used as an exact reference); the outputs have that dtype;
* the weight (and bias) gradient is accumulated over chunks in a float32 buffer, one ``D`` matmul per chunk, and
  cast to the weight's dtype once at the end; ``grad_hidden`` is written per chunk in ``hidden``'s dtype.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor

from evolrl.logprobs.autocast import autocast_dtype, autocast_off


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """The matmul dtype: autocast's when it is on (as ``lm_head`` would run), else the inputs' promoted dtype."""
    return autocast_dtype(hidden.device.type) or torch.promote_types(hidden.dtype, weight.dtype)


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """``hidden @ weight.T + bias`` for one chunk ``[C, V]``, computed in the weight's dtype, returned in ``dtype``
    (a copy unless the dtypes match: then the matmul's buffer). Eager chunks take the softmax dtype here, so the
    matmul's own buffer is gone before the softmax's work; compiled ones the weight's, the cast fused into their
    kernels."""
    logits = hidden.to(weight.dtype) @ weight.T
    return (logits if bias is None else logits.add_(bias)).to(dtype)


def _chunk_stats(logits: Tensor, tokens: Tensor, temperature: float, softmax_dtype: torch.dtype,
                 vocab_mean: bool) -> tuple[Tensor, ...]:
    """One chunk's ``(log p(token), entropy, lse[, mean log p])`` from its ``logits`` (overwritten), with ``x =
    logits / T`` in ``softmax_dtype``."""
    logq = logits.to(softmax_dtype).div_(temperature)  # .to copies unless the dtypes match; then the matmul's buffer
    lse = torch.logsumexp(logq, dim=-1)
    logq.sub_(lse[:, None])  # log p, in place
    stats = (logq.gather(-1, tokens[:, None]).squeeze(-1), -logq.exp().mul_(logq).sum(-1), lse)
    return (*stats, logq.mean(-1)) if vocab_mean else stats


def _chunk_grad(logits: Tensor, tokens: Tensor, lse: Tensor, entropy: Tensor, grad_logp: Tensor | None,
                grad_entropy: Tensor | None, temperature: float, dtype: torch.dtype,
                bias: bool) -> tuple[Tensor, Tensor | None]:
    """One chunk's ``dLoss/dlogits`` in ``dtype`` (the matmuls'), and with ``bias`` its sum over rows in ``lse``'s
    dtype (the bias's gradient), from its ``logits`` (overwritten): logprobs.py's formulas, in place, in ``lse``'s
    dtype."""
    logq = logits.to(lse.dtype).div_(temperature).sub_(lse[:, None])  # log p
    p = logq.exp()
    if grad_entropy is not None:  # -g_H * p * (log p + H)
        grad = logq.add_(entropy[:, None]).mul_(p).mul_(-grad_entropy[:, None])
        if grad_logp is not None:  # g_logp * (onehot - p)
            grad.sub_(p.mul_(grad_logp[:, None]))
    else:
        grad = p.mul_(-grad_logp[:, None])
    if grad_logp is not None:
        grad.scatter_add_(-1, tokens[:, None], grad_logp[:, None])
    grad = grad.div_(temperature)  # dx/dlogits = 1/T
    return grad.to(dtype), grad.sum(0) if bias else None


@cache
def _chunk_fn(fn, compiled: bool):
    """``fn``, or with ``compiled`` its ``torch.compile``d form, built once per process (shapes dynamic: the last
    chunk is shorter): the chunk's casts, elementwise work and reductions become a few fused kernels instead of a
    dozen passes over its ``[C, V]`` logits (the matmuls stay outside, library calls)."""
    return torch.compile(fn, dynamic=True) if compiled else fn


def _head_stats(hidden: Tensor, weight: Tensor, bias: Tensor | None, tokens: Tensor, temperature: float,
                 chunk_size: int, vocab_mean: bool = False, compiled: bool = False
                 ) -> dict[str, Tensor | torch.dtype | None]:
    """The chunk loop of the forward: per row ``logp``, ``entropy``, ``lse`` (and ``mean_logp``, the mean of ``log p``
    over the vocabulary, with ``vocab_mean``), plus the compute-dtype copies ``w``, ``b`` and ``dtype``; ``compiled``:
    each chunk's statistics through ``torch.compile`` (:func:`_chunk_fn`)."""
    dtype = _compute_dtype(hidden, weight)
    softmax_dtype = torch.promote_types(dtype, torch.float32)
    rows = hidden.shape[0]
    out = {"logp": hidden.new_empty(rows, dtype=softmax_dtype)}
    out["entropy"], out["lse"] = torch.empty_like(out["logp"]), torch.empty_like(out["logp"])
    out["mean_logp"] = torch.empty_like(out["logp"]) if vocab_mean else None
    names = ("logp", "entropy", "lse", "mean_logp")[:4 if vocab_mean else 3]
    chunk_stats, logits_dtype = _chunk_fn(_chunk_stats, compiled), dtype if compiled else softmax_dtype
    with autocast_off(hidden.device.type):  # dtypes are explicit below
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        for start in range(0, rows, chunk_size):
            rows_ = slice(start, start + chunk_size)
            stats = chunk_stats(_logits(hidden[rows_], w, b, logits_dtype), tokens[rows_], temperature=temperature,
                                softmax_dtype=softmax_dtype, vocab_mean=vocab_mean)
            for name, value in zip(names, stats, strict=True):
                out[name][rows_] = value
    return out | {"w": w, "b": b, "dtype": dtype}


class _HeadLogprobEntropy(torch.autograd.Function):
    """``(log p(token), H)`` for rows ``hidden [R, H]`` under ``softmax((hidden @ weight.T + bias) / T)``."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, tokens: Tensor, temperature: float,
                chunk_size: int, compiled: bool) -> tuple[Tensor, Tensor]:
        out = _head_stats(hidden, weight, bias=bias, tokens=tokens, temperature=temperature, chunk_size=chunk_size,
                          compiled=compiled)
        # The compute-dtype copies, not the weights: the backward then casts nothing (a [V, H] copy per pass saved).
        ctx.save_for_backward(hidden, out["w"], out["b"], tokens, out["lse"], out["entropy"])
        ctx.weight_dtype, ctx.bias_dtype = weight.dtype, None if bias is None else bias.dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: its term is skipped
        ctx.temperature, ctx.chunk_size, ctx.dtype, ctx.compiled = temperature, chunk_size, out["dtype"], compiled
        return out["logp"], out["entropy"]

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        hidden, w, b, tokens, lse, entropy = ctx.saved_tensors
        if grad_logp is None and grad_entropy is None:  # neither output reached the loss: no gradient (zeros)
            return None, None, None, None, None, None, None
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        dtype, softmax_dtype = ctx.dtype, lse.dtype
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(w.shape, dtype=softmax_dtype, device=w.device) if need_weight else None
        grad_bias = torch.zeros(b.shape, dtype=softmax_dtype, device=b.device) if need_bias else None
        grad_logp = None if grad_logp is None else grad_logp.to(softmax_dtype)
        grad_entropy = None if grad_entropy is None else grad_entropy.to(softmax_dtype)
        chunk_grad, logits_dtype = _chunk_fn(_chunk_grad, ctx.compiled), dtype if ctx.compiled else softmax_dtype
        with autocast_off(hidden.device.type):
            for start in range(0, hidden.shape[0], ctx.chunk_size):
                rows_ = slice(start, start + ctx.chunk_size)
                h = hidden[rows_].to(dtype)
                grad, grad_sum = chunk_grad(_logits(h, w, b, logits_dtype), tokens[rows_], lse[rows_],
                                            entropy=entropy[rows_],
                                            grad_logp=None if grad_logp is None else grad_logp[rows_],
                                            grad_entropy=None if grad_entropy is None else grad_entropy[rows_],
                                            temperature=ctx.temperature, dtype=dtype, bias=grad_bias is not None)
                if grad_bias is not None:
                    grad_bias += grad_sum
                if grad_hidden is not None:
                    grad_hidden[rows_] = grad @ w
                if grad_weight is not None and dtype == softmax_dtype:
                    grad_weight.addmm_(grad.T, h)  # in place: no [V, H] temporary per chunk
                elif grad_weight is not None:
                    grad_weight += grad.T @ h  # one D matmul per chunk (a [V, H] D temporary), summed in float32
                del grad, grad_sum  # one chunk's buffers at a time, as in the forward
        return (grad_hidden, None if grad_weight is None else grad_weight.to(ctx.weight_dtype),
                None if grad_bias is None else grad_bias.to(ctx.bias_dtype), None, None, None, None)


def head_logprobs_and_entropy(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int = 1024,
    bias: Tensor | None = None, compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(log p(token), entropy)``, each ``[N, L]``, of ``softmax((hidden @ weight.T + bias) / T)``, chunk by chunk.

    Equals ``logprobs_and_entropy(hidden @ weight.T, tokens, temperature)`` (values and gradients with respect to
    ``hidden``, ``weight`` and ``bias``) without ever holding more than ``chunk_size`` rows of logits.

    Args:
        hidden: ``[N, L, H]`` final hidden states (after the model's last norm) aligned with ``tokens``.
        weight: ``[V, H]`` the LM head's weight (may be tied to the input embedding; gradients then add up).
        tokens: ``[N, L]`` the tokens whose log-probs are wanted.
        temperature: Sampling temperature; the policy is ``softmax(logits / T)``, as in the sampler.
        chunk_size: Rows (tokens) per chunk: peak memory is about ``4 * chunk_size * V`` float32 numbers.
        bias: ``[V]`` the head's bias, if it has one.
        compiled: Each chunk's elementwise work and reductions through ``torch.compile`` (forward and backward):
            a few fused kernels per chunk; the same numbers up to float rounding.

    Returns:
        float32 tensors (float64 when the inputs are float64 outside autocast).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n, length, width = hidden.shape
    logp, entropy = _HeadLogprobEntropy.apply(hidden.reshape(n * length, width), weight, bias,
                                              tokens.reshape(n * length), temperature, chunk_size, compiled)
    return logp.view(n, length), entropy.view(n, length)


@torch.no_grad()
def head_token_stats(
    hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int = 1024,
    bias: Tensor | None = None, compiled: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(log p(token), entropy, mean log p over the vocabulary)``, each ``[N, L]``, without gradients: what a reward
    that reads the policy needs (``evolrl.rewards.policy_signal``), from the same chunk loop as
    :func:`head_logprobs_and_entropy` (whose log-probs and entropy these equal, ``compiled`` too) plus one mean per
    row."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n, length, width = hidden.shape
    out = _head_stats(hidden.reshape(n * length, width), weight, bias=bias, tokens=tokens.reshape(n * length),
                       temperature=temperature, chunk_size=chunk_size, vocab_mean=True, compiled=compiled)
    return tuple(out[k].view(n, length) for k in ("logp", "entropy", "mean_logp"))
