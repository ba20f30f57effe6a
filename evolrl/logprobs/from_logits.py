"""Token log-probs and full-vocabulary entropy from logits, chunked, with a hand-written backward.

A naive ``log_softmax(logits.float() / T)`` materializes several ``[N, L, V]`` float32 copies
(151k vocabulary x 12k tokens is ~7 GB per sequence), and autograd through ``logsumexp``,
``softmax`` and the entropy's product keeps and revisits more of them. Here rows are processed in
chunks by one autograd function that saves only the logits (already held by the model's
forward) and two numbers per row; its backward rebuilds ``log p`` once and writes the gradient of
both outputs in a single pass:

    d log p(t) / dx = onehot(t) - p        d H / dx = -p * (log p + H)      (x = logits / T)
"""

from __future__ import annotations

import torch
from torch import Tensor


class _LogprobEntropy(torch.autograd.Function):
    """``(log p(token), H)`` per row of ``logits [C, V]``; backward recomputes ``log p`` from the logits."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
        logq = logits.to(torch.float32, copy=True).div_(temperature)
        lse = torch.logsumexp(logq, dim=-1)
        logq.sub_(lse[:, None])  # log p, in place
        logp = logq.gather(-1, tokens[:, None]).squeeze(-1)
        entropy = -logq.exp().mul_(logq).sum(-1)
        ctx.save_for_backward(logits, tokens, lse, entropy)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        logits, tokens, lse, entropy = ctx.saved_tensors
        logq = logits.to(torch.float32, copy=True).div_(ctx.temperature).sub_(lse[:, None])
        p = logq.exp()
        if grad_entropy is not None:  # -g_H * p * (log p + H)
            grad = logq.add_(entropy[:, None]).mul_(p).mul_(-grad_entropy[:, None])
        else:
            grad = torch.zeros_like(logq)
        if grad_logp is not None:  # g_logp * (onehot - p)
            grad.sub_(p.mul_(grad_logp[:, None]))
            grad.scatter_add_(-1, tokens[:, None], grad_logp[:, None])
        return grad.div_(ctx.temperature).to(logits.dtype), None, None


def logprobs_and_entropy(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[Tensor, Tensor]:
    """``(log p(token), entropy of softmax(logits / T))``, each ``[N, L]`` float32.

    Args:
        logits: ``[N, L, V]`` next-token logits aligned with ``tokens`` (any float dtype).
        tokens: ``[N, L]`` the tokens whose log-probs are wanted.
        temperature: Sampling temperature; the policy is ``softmax(logits / T)``, as in the sampler.
        chunk_size: Rows (tokens) per chunk.
    """
    n, length, vocab = logits.shape
    flat_logits = logits.reshape(n * length, vocab)
    flat_tokens = tokens.reshape(n * length)
    logps, entropies = [], []
    for start in range(0, n * length, chunk_size):
        logp, entropy = _LogprobEntropy.apply(flat_logits[start : start + chunk_size],
                                              flat_tokens[start : start + chunk_size], temperature)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps).view(n, length), torch.cat(entropies).view(n, length)


@torch.no_grad()
def token_stats(logits: Tensor, tokens: Tensor, temperature: float = 1.0,
                 chunk_size: int = 1024) -> tuple[Tensor, Tensor, Tensor]:
    """``(log p(token), entropy, mean log p over the vocabulary)``, each ``[N, L]`` float32, without gradients: the
    logits path's twin of ``chunked_head.head_token_stats``."""
    n, length, vocab = logits.shape
    flat_logits, flat_tokens = logits.reshape(n * length, vocab), tokens.reshape(n * length)
    parts = []
    for start in range(0, n * length, chunk_size):
        logq = torch.log_softmax(flat_logits[start : start + chunk_size].float() / temperature, dim=-1)
        logp = logq.gather(-1, flat_tokens[start : start + chunk_size, None]).squeeze(-1)
        parts.append(torch.stack((logp, -(logq.exp() * logq).sum(-1), logq.mean(-1))))
    return tuple(torch.cat(parts, dim=-1).view(3, n, length))
