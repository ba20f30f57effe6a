"""How a training step's sequences are cut into optimizer steps and forward/backward passes, and how a pass runs.

A plain dataclass, declared and checked once (the CLI expands its fields: ``model.batching.micro_batch_size``) and
passed whole to :class:`~evolrl.training.update.GRPOUpdate`. None of these settings changes the update's math: the
loss normalizer is fixed per mini-batch before its passes, so every split, padded or packed, fused head or not, gives
the same update up to float rounding (``tests/test_packing.py``, ``tests/test_training.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from evolrl.settings import check_int, require


@dataclass(frozen=True)
class Batching:
    """Mini-batches (one optimizer step each) and micro-batches (one forward/backward pass each)."""

    mini_batch_size: int = 32
    """Sequences per optimizer step (paper: 32, one prompt's G)."""
    micro_batch_size: int = 2
    """Sequences per forward/backward pass (at most ``mini_batch_size``), unless ``max_tokens_per_micro_batch``."""
    max_tokens_per_micro_batch: int | None = None
    """Instead of ``micro_batch_size``, bin each mini-batch's sequences into passes of at most this many tokens
    (padded: rows x longest; packed: the row), a longer one alone; same math."""
    packed: bool = False
    """Each pass's sequences back to back in one row, without padding (under sdpa, attention one sequence at a time:
    ``sequencewise_attention.py``); ``fit`` refuses it at start for a model whose packed sequences would see each
    other (attention not sdpa, eager, flash or flex, or a probe sees it)."""
    flex_attention: bool = False
    """Packed passes attend with one FlexAttention call per layer and row instead of one sdpa call per sequence
    (``packed_flex.py``): fewer kernel launches on a GPU; ``fit`` refuses it at start on a CPU (torch has no
    FlexAttention backward there). Needs ``packed``."""
    fused_head: bool = True
    """The LM head applied chunk by chunk inside the log-prob step, so a pass's logits never exist whole; ``fit``
    refuses it at start for a model whose output layer is not a plain Linear or whose logits are not that layer's
    output unchanged (e.g. soft-capped): set it to false there."""
    logprob_chunk_size: int = 1024
    """Tokens per chunk of the log-prob/entropy computation."""
    no_grad_pass_multiple: int = 2
    """A pass without gradients (the reference's log-probs, the old log-probs of later mini-batches) takes up to this
    many times a training pass's sequences (``micro_batch_size``) or tokens (``max_tokens_per_micro_batch``), its
    sequences drawn from the whole step rather than one mini-batch: it keeps no activations for a backward, so at
    twice the size it holds less than a training pass; fewer, larger passes, the same numbers."""
    compile_blocks: bool = False
    """Each decoder block's forward through ``torch.compile`` (``compiled.py``): its norms, rotary embedding, SwiGLU
    and casts fused into a few kernels, forward and backward (on a GPU, a fraction of the kernel launches); with
    ``fused_head``, each chunk's softmax statistics and their gradient too (``chunked_head.py``: a few passes over
    the chunk's logits instead of a dozen). The first passes pay the compilation (tens of seconds a variant on a
    CPU); the numbers agree with the uncompiled pass up to float rounding."""
    reduce_every_pass: bool = False
    """Under FSDP, reduce-scatter the gradients after every pass instead of once per mini-batch (its last pass): one
    collective per pass, but the full float32 gradients are never held unsharded between passes (4B: 15 GiB a rank;
    ``tools/gpu_budget.py --reduce-every-pass`` estimates both)."""

    def __post_init__(self) -> None:
        check_int("Batching.mini_batch_size", self.mini_batch_size, 1)
        check_int("Batching.micro_batch_size", self.micro_batch_size, 1)
        if self.max_tokens_per_micro_batch is None:
            require(self.micro_batch_size <= self.mini_batch_size, "Batching.micro_batch_size", self.micro_batch_size,
                    allowed=f"at most mini_batch_size={self.mini_batch_size} "
                    "(a micro-batch is part of one mini-batch)")
        else:
            check_int("Batching.max_tokens_per_micro_batch", self.max_tokens_per_micro_batch, 1)
        require(isinstance(self.packed, bool), "Batching.packed", self.packed, allowed="true or false")
        require(isinstance(self.flex_attention, bool), "Batching.flex_attention", self.flex_attention,
                allowed="true or false")
        require(not self.flex_attention or self.packed, "Batching.flex_attention", self.flex_attention,
                allowed="false unless packed is true (it attends over a packed row)")
        require(isinstance(self.fused_head, bool), "Batching.fused_head", self.fused_head, allowed="true or false")
        check_int("Batching.logprob_chunk_size", self.logprob_chunk_size, 1)
        check_int("Batching.no_grad_pass_multiple", self.no_grad_pass_multiple, 1)
        require(isinstance(self.compile_blocks, bool), "Batching.compile_blocks", self.compile_blocks,
                allowed="true or false")
        require(isinstance(self.reduce_every_pass, bool), "Batching.reduce_every_pass", self.reduce_every_pass,
                allowed="true or false")
