"""How the passes over a step's sequences run: one settings object, handed whole from ``Batching`` to the log-prob
engine, so that no pass setting travels alone through the calls between them."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Passes:
    """What a pass computes with; none of these changes its numbers beyond float rounding. The user's settings and
    their checks are ``evolrl.training.Batching``'s (``Batching.passes``)."""

    packed: bool = False
    """A micro-batch's sequences back to back in one row (``packing.py``)."""
    flex: bool = False
    """Packed rows attend with one FlexAttention call per layer (``packed_flex.py``); needs ``packed``."""
    fused_head: bool = True
    """The LM head applied chunk by chunk inside the log-prob step (``chunked_head.py``)."""
    compiled: bool = False
    """Decoder blocks and, with ``fused_head``, the head's chunks through ``torch.compile`` (``compiled.py``)."""
    shared_prompts: bool = False
    """Each distinct prompt computed once, its responses on its KV cache (``shared_prompts.py``)."""
    chunk_size: int = 1024
    """Tokens per chunk of the log-prob/entropy computation."""


def passes_with(passes: Passes, settings: dict) -> Passes:
    """``passes`` with some fields given by name: a pass function's keyword shorthand (``chunk_size=16``) for scripts
    and tests that hold no ``Passes``; an unknown name is a TypeError naming it."""
    return replace(passes, **settings) if settings else passes
