"""Token log-probs and full-vocabulary entropy from logits, chunked.

A naive ``log_softmax(logits.float() / T)`` materializes several ``[N, L, V]``
float32 copies (151k vocabulary x 12k tokens is ~7 GB per sequence). Here rows
are processed in chunks, and under autograd each chunk is checkpointed, so only
the logits themselves (already held by the model's forward) stay alive and a
chunk's temporaries are recomputed in backward.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _chunk(logits: Tensor, tokens: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    x = logits.float() / temperature  # [C, V]
    lse = torch.logsumexp(x, dim=-1)  # [C]
    logp = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.softmax(x, dim=-1) * x).sum(-1)  # H = logsumexp(x) - E_p[x]
    return logp, entropy


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
        part = (flat_logits[start : start + chunk_size], flat_tokens[start : start + chunk_size], temperature)
        if torch.is_grad_enabled() and logits.requires_grad:
            logp, entropy = checkpoint(_chunk, *part, use_reentrant=False)
        else:
            logp, entropy = _chunk(*part)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps).view(n, length), torch.cat(entropies).view(n, length)
