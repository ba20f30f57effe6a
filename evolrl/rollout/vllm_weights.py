"""Pushing the policy's weights into a colocated vLLM engine, and what a push must leave behind.

A push streams one full tensor at a time into ``collective_rpc("reload_weights")`` (no checkpoint on disk, never a
second copy of the whole model), then empties vLLM's prefix cache: its blocks hold keys/values computed with the
weights just replaced.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from evolrl.lora import merged_tensors


def full_tensors(policy: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's parameters and buffers as full (unsharded) tensors in ``dtype``, one at a time, with a LoRA
    policy's adapters merged into their layers' weights (``evolrl.lora.merged_tensors``).

    Under FSDP2 each ``full_tensor`` is a collective: every rank must consume the whole iterator.
    """
    for name, tensor in merged_tensors(policy):
        yield name, tensor.detach().to(dtype)


def stream_weights(llm, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """``tensors`` (e.g. :func:`full_tensors`) into ``llm``, one full tensor in flight at a time.

    If vLLM raises part-way, the rest of the iterator still runs, so that this rank takes part in every FSDP gather
    (or weight broadcast) the other side makes before it learns of the failure (``ranks.fail_together``).
    """
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
    finally:
        for _ in tensors:
            pass


def forget_cached_prompts(llm) -> None:
    """Drop vLLM's prefix cache: its blocks hold keys/values computed with the weights just replaced.

    Reset rather than turned off: within one version the cache is what lets the n samples of a prompt (and prompts
    sharing a system prompt) prefill once. ``LLM.generate`` returns only when all its requests are done, so no block
    is in use here and the reset cannot be refused; if vLLM refuses all the same, sampling on would mix two versions
    of the weights, so it is an error.
    """
    if not llm.reset_prefix_cache():
        raise RuntimeError(
            "vLLM refused to reset its prefix cache after a weight update (some KV blocks are still in use), "
            "so it would sample with keys/values of the previous weights; no request should be running "
            "between training steps"
        )
