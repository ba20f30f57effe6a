"""The log-prob engine: per-token log-probs and entropy of many sequences under a causal LM, fast.

Everything the GRPO update needs from a model's forward pass lives here, apart from the loss: the sequences as
tensors (:class:`Sequences`), right-padded, packed or shared-prompt passes (``forward.py``, ``packing.py``,
``shared_prompts.py``), attention that keeps
packed sequences apart (``sequencewise_attention.py``, ``packed_flex.py``), compiled blocks (``compiled.py``), the LM
head fused into the log-softmax (``chunked_head.py``, ``from_logits.py``) and the CPU allocator setting
(``allocator.py``). The update calls it through four functions, each given the :class:`Passes` settings whole:

* :func:`prepare` and :func:`compile_for`: once per model at build, the packed passes' attention, then the
  compiled blocks;
* :func:`check`: once at start, on the device, that the model computes what the settings promise;
* :func:`token_stats`: one pass over a micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from evolrl.logprobs.allocator import keep_freed_memory
from evolrl.logprobs.compiled import check_compiler, compile_blocks
from evolrl.logprobs.forward import check_fused_head, sequence_logprobs
from evolrl.logprobs.packed_flex import check_flex, use_packed_flex
from evolrl.logprobs.packing import check_packing, packed_logprobs
from evolrl.logprobs.passes import Passes
from evolrl.logprobs.sequences import Sequences, trained_sequences
from evolrl.logprobs.shared_prompts import check_shared_prompts, shared_prompt_logprobs
from evolrl.logprobs.sequencewise_attention import use_sequencewise_attention

__all__ = ["Passes", "Sequences", "check", "compile_for", "keep_freed_memory", "prepare", "token_stats",
           "trained_sequences"]


def prepare(model: nn.Module | None, passes: Passes) -> nn.Module | None:
    """``model``'s attention set up for ``passes``: packed rows one sequence at a time (or, with ``flex``, one
    FlexAttention call per row). Done before a reference is copied from the policy; :func:`compile_for` comes last."""
    if model is not None and passes.packed:
        use_sequencewise_attention(model)
        if passes.flex:
            use_packed_flex(model)
    return model


def compile_for(model: nn.Module | None, passes: Passes) -> nn.Module | None:
    """``model`` with its blocks' forwards compiled where ``passes.compiled``: last, on the finished (and sharded)
    model."""
    return compile_blocks(model) if model is not None and passes.compiled else model


def check(model: nn.Module, device: torch.device, passes: Passes,
          precision: Callable[[], AbstractContextManager] = nullcontext) -> None:
    """At start, on ``device``: each setting of ``passes`` that is on works for ``model`` (a SettingError naming it
    if not); ``precision``: the run's autocast, which the shared-prompt probe runs under (its kernels are the run's)."""
    if passes.flex:
        check_flex(device)
    if passes.packed:  # on its device, with the attention kernels it trains with
        check_packing(model)
    if passes.fused_head:
        check_fused_head(model)
    if passes.compiled:
        check_compiler(device)
    if passes.shared_prompts:
        with precision():
            check_shared_prompts(model)


def token_stats(model: nn.Module, seqs: Sequences, temperature: float, passes: Passes = Passes(),  # noqa: B008
                vocab_mean: bool = False) -> tuple[Tensor, ...]:
    """``(log-prob, entropy)`` of every next token of ``seqs``, ``[N, T - 1]``, under ``softmax(logits /
    temperature)`` (and the vocabulary's mean log-prob with ``vocab_mean``): one packed row, right-padded rows, or
    each distinct prompt once and the responses on its KV cache, as ``passes`` say."""
    logprobs = (packed_logprobs if passes.packed else shared_prompt_logprobs if passes.shared_prompts
                else sequence_logprobs)
    return logprobs(model, seqs, temperature=temperature, passes=passes, vocab_mean=vocab_mean)
