"""The policy's forward pass over right-padded sequences: log-probs and entropy of every response token.

The padding-free alternative (several sequences in one row) is ``packing.py``.
"""

from __future__ import annotations

import inspect

import torch.nn.functional as F
from torch import Tensor

from evolrl.algorithms.logprobs import logprobs_and_entropy
from evolrl.training.sequences import Sequences


def sequence_logprobs(model, seqs: Sequences, temperature: float, chunk_size: int) -> tuple[Tensor, Tensor]:
    """``(log-prob, entropy)`` of every next token, ``[N, T - 1]``, under ``softmax(logits / temperature)``.

    Only positions from the first response token on get logits (the LM head and the log-softmax over the
    vocabulary are the costly part of a small model's step); earlier positions are returned as 0. Without response
    tokens (``Sequences.filler``) the last position still gets logits, so the LM head is part of the pass.
    """
    width = seqs.input_ids.shape[1]
    first = int(seqs.response_mask.any(0).nonzero()[0]) if seqs.response_mask.any() else width - 2
    keep = {"logits_to_keep": width - first} if takes_logits_to_keep(model) else {}
    logits = model(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask, use_cache=False, **keep).logits
    logits = logits[:, -(width - first) :] if not keep else logits  # models without logits_to_keep
    logp, entropy = logprobs_and_entropy(logits[:, :-1], seqs.input_ids[:, first + 1 :], temperature, chunk_size)
    return F.pad(logp, (first, 0)), F.pad(entropy, (first, 0))


def takes_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters
