"""The policy's forward pass: log-probs and entropy of the scored tokens, from the model's logits or its head fused in.

:func:`model_stats` runs the model once and returns ``(log-prob, entropy)`` at the positions a ``select``
function picks. Two ways, the same numbers (tested, values and gradients):

* ``fused_head=True`` (default): while the model runs, its output layer's ``forward`` is swapped for one that hands
  the final hidden states to ``head_logprobs_and_entropy`` (``logprobs/chunked_head.py``) and returns
  ``[..., 2]`` (log-prob, entropy) in place of the logits, so the ``[rows, width, vocabulary]`` logits never exist,
  not even one chunk beyond the log-prob step's own. A swap, not a call of the model's body and then its head:
  under FSDP2 the head's weight is gathered only during the root module's forward, and the result has to leave
  through the model's forward for FSDP's backward hooks to see it. Needs a plain ``nn.Linear`` head and a model
  that returns the head's output as its logits unchanged; :func:`check_fused_head` checks both at start (Gemma 2's
  logit soft-capping, for one, fails it).
* ``fused_head=False``: the model's logits, then ``logprobs_and_entropy`` chunk by chunk.

:func:`sequence_logprobs` is the right-padded micro-batch; the padding-free one is ``packing.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evolrl.logprobs.chunked_head import head_logprobs_and_entropy, head_token_stats
from evolrl.logprobs.from_logits import logprobs_and_entropy, token_stats
from evolrl.logprobs.passes import Passes, passes_with
from evolrl.logprobs.sequences import Sequences
from evolrl.settings import require


def model_stats(model, inputs: dict, select: Callable[[Tensor], Tensor], targets: Tensor, temperature: float,
                passes: Passes, vocab_mean: bool = False) -> tuple[tuple[Tensor, ...], object]:
    """``(log p(target), entropy)``, each like ``targets``, of ``softmax(logits / temperature)`` (with ``vocab_mean``,
    no gradients, for a reward that reads the policy: also the mean of ``log p`` over the vocabulary), and the model's
    output (its ``past_key_values``, say) with the statistics in place of its logits.

    Args:
        model: A Hugging Face causal LM (or one wrapped by FSDP2).
        inputs: Keyword arguments of ``model(...)``.
        select: From the model's last output (hidden states or logits) ``[rows, width, ...]``, the positions whose
            next token is ``targets``, aligned with them.
        targets: ``[rows, length]`` the scored tokens.
        passes: Read here: ``fused_head``, ``chunk_size`` and ``compiled`` (with ``fused_head``, each chunk's
            softmax statistics and gradient through ``torch.compile``, ``chunked_head._chunk_fn``).
    """
    if not passes.fused_head:
        output = model(**inputs)
        stats = token_stats if vocab_mean else logprobs_and_entropy
        return stats(select(output.logits), targets, temperature=temperature, chunk_size=passes.chunk_size), output
    head = model.get_output_embeddings()
    stats = head_token_stats if vocab_mean else head_logprobs_and_entropy

    def fused(hidden: Tensor) -> Tensor:
        return torch.stack(stats(select(hidden), head.weight, tokens=targets, temperature=temperature,
                                  chunk_size=passes.chunk_size, bias=head.bias, compiled=passes.compiled), -1)

    with _forward_replaced(head, fused):
        output = model(**inputs)
    return output.logits.unbind(-1), output


@contextmanager
def _forward_replaced(module: nn.Module, forward: Callable) -> Iterator[None]:
    """``module(...)`` calls ``forward`` inside the block (hooks still run); the module's own forward after it."""
    own = vars(module).get("forward")
    module.forward = forward
    try:
        yield
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


def sequence_logprobs(model, seqs: Sequences, temperature: float, passes: Passes = Passes(),  # noqa: B008
                      vocab_mean: bool = False, **settings) -> tuple[Tensor, ...]:
    """``(log-prob, entropy)`` of every next token, ``[N, T - 1]``, under ``softmax(logits / temperature)`` (and the
    vocabulary's mean log-prob with ``vocab_mean``, see :func:`model_stats`); ``settings``: fields of ``passes``
    by name (``chunk_size=16``), as in ``packing.py`` and ``shared_prompts.py``.

    Only positions from the first response token on go through the LM head (the head and the log-softmax over the
    vocabulary are the costly part of a small model's step); earlier positions are returned as 0. Without response
    tokens (``Sequences.filler``) the last position still does, so the LM head is part of the pass.
    """
    width = seqs.input_ids.shape[1]
    cols = seqs.host_layout().cols  # where responses start, read on the host
    first = int(cols.min()) if len(cols) else width - 2
    keep = {"logits_to_keep": width - first} if takes_logits_to_keep(model) else {}
    inputs = {"input_ids": seqs.input_ids, "attention_mask": seqs.attention_mask, "use_cache": False, **keep}
    stats, _ = model_stats(model, inputs, select=lambda out: out[:, -(width - first) : -1],
                           targets=seqs.input_ids[:, first + 1 :], temperature=temperature,
                           passes=passes_with(passes, settings), vocab_mean=vocab_mean)
    return tuple(F.pad(values, (first, 0)) for values in stats)


def takes_logits_to_keep(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


@torch.no_grad()
def check_fused_head(model, key: str = "Batching.fused_head") -> None:
    """Raise :class:`~evolrl.settings.SettingError` unless the fused head computes what ``model``'s logits would give.

    Two conditions, checked exactly: the output layer is a plain ``nn.Linear`` (the fused head applies its weight
    and bias), and a forward pass returns that layer's output unchanged as the logits (no soft-capping, scaling or
    upcast after the head).
    """
    head = model.get_output_embeddings()
    advice = "set it to false for this model"
    require(type(head) is nn.Linear, key, True,
            allowed=f"a model whose output layer is a plain torch.nn.Linear (this one's: {type(head).__name__}); "
            f"{advice}")
    device = next(model.parameters()).device
    ids = (torch.arange(8, device=device) * 7 % min(int(model.config.vocab_size), 200))[None]
    seen = []
    hook = head.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        logits = model(input_ids=ids, use_cache=False).logits
    finally:
        hook.remove()
    require(len(seen) == 1 and torch.equal(seen[0], logits), key, True,
            allowed="a model that returns its output layer's result as its logits unchanged (this one changes it "
            f"after the layer, e.g. soft-capping); {advice}")
